// Ring allreduce over a Transport: reduce-scatter, then allgather, segmented and pipelined.
//
// The data is split into size() chunks. A chunk is a list of spans (pieces of tensors), so a
// fused batch of tensors is reduced in place, with no copy into a fusion buffer; a plain buffer
// is the one-span case. With r = rank, n = size and all chunk indices mod n:
//   reduce-scatter, step s = 0..n-2: send chunk (r - s) to the right neighbour, receive chunk
//     (r - s - 1) from the left one and reduce it into the local copy. Afterwards rank r holds the
//     full reduction of chunk (r + 1).
//   allgather, step s = 0..n-2: send chunk (r + 1 - s) to the right, receive chunk (r - s) from
//     the left, in place.
// Each chunk moves as messages of at most `segment_bytes`; a message may cover pieces of several
// spans and travels as ONE transfer (Transport::IsendSpans), so many small fused tensors cost a
// few large messages, not one message each. Sender and receiver derive the same messages because
// every rank has the same span sizes. Received reduce-scatter messages land contiguous in a
// scratch slot and are reduced straight into their spans; allgather messages land in place. The
// receive of message j+1 is in flight while message j is being reduced (two scratch slots), so
// reduction overlaps transfer.
// The order in which contributions are added to an element depends only on its chunk index, never
// on timing; callers that keep every element in the same chunk (the executor lays fused tensors
// out chunk-major) get bit-identical results whatever was fused with what.
// `postscale` is applied to the owned chunk as the last reduce-scatter step completes it, message
// by message while it is in cache, so averaging costs no pass of its own. float16/bfloat16 are
// reduced in float32 and rounded once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "common/tensor_ref.h"
#include "common/types.h"

namespace hvdl {

struct RingStats {
  int64_t bytes_sent = 0;
  int steps = 0;
};

// chunks[c] lists the spans of chunk c, in order; chunks.size() must equal t->size().
Status RingAllreduce(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                     ReduceOp op, double postscale, size_t segment_bytes, RingStats* stats);

// The two phases of RingAllreduce, for algorithms built from them (comm/hierarchical). After
// RingReduceScatter rank r holds the full reduction of chunk RingOwnedChunk(r, n);
// RingAllgather sends each rank's owned chunk to every other rank, in place. RingReduceScatter
// multiplies the owned chunk by `postscale` as it completes it.
Status RingReduceScatter(Transport* t, const std::vector<std::vector<Span>>& chunks,
                         DataType dtype, ReduceOp op, size_t segment_bytes, RingStats* stats,
                         double postscale = 1.0);
Status RingAllgather(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                     size_t segment_bytes, RingStats* stats);
int RingOwnedChunk(int rank, int n);
// Multiplies every element of `spans` by `factor` (nothing when it is 1).
void ScaleSpans(const std::vector<Span>& spans, DataType dtype, double factor);

// One contiguous buffer split into chunks of the given element counts.
std::vector<std::vector<Span>> ContiguousChunks(void* buf, const std::vector<int64_t>& counts,
                                                DataType dtype);

// Even split of `count` elements into `n` chunks, the first count % n one element longer.
std::vector<int64_t> EvenChunks(int64_t count, int n);

}  // namespace hvdl
