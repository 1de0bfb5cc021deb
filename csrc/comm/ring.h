// Ring allreduce over a Transport: reduce-scatter, then allgather, segmented and pipelined.
//
// The buffer is split into size() chunks whose element counts the caller chooses (chunks[i];
// zero-length chunks are fine, so counts smaller than the number of ranks work). With r = rank,
// n = size and all indices mod n:
//   reduce-scatter, step s = 0..n-2: send chunk (r - s) to the right neighbour, receive chunk
//     (r - s - 1) from the left one and reduce it into the local copy. Afterwards rank r holds the
//     full reduction of chunk (r + 1).
//   allgather, step s = 0..n-2: send chunk (r + 1 - s) to the right, receive chunk (r - s) from
//     the left, copying it in place.
// Inside each step the chunk moves in segments of `segment_bytes`: the receive of segment j+1 is in
// flight while segment j is being reduced, so reduction overlaps transfer.
// The order in which contributions are added to an element depends only on its chunk index, never
// on timing; callers that keep every element in the same chunk (the executor lays fused buffers out
// chunk-major) therefore get bit-identical results whatever was fused with what.
// `postscale` is applied to the owned chunk between the two phases, so averaging costs 1/n of a
// pass. float16/bfloat16 are reduced in float32 and rounded once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "common/types.h"

namespace hvdl {

struct RingStats {
  int64_t bytes_sent = 0;
  int steps = 0;
};

Status RingAllreduce(Transport* t, void* buf, const std::vector<int64_t>& chunks, DataType dtype,
                     ReduceOp op, double postscale, size_t segment_bytes, RingStats* stats);

// Even split of `count` elements into `n` chunks, the first count % n one element longer.
std::vector<int64_t> EvenChunks(int64_t count, int n);

}  // namespace hvdl
