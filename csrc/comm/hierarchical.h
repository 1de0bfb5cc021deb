// Hierarchical allreduce over two Transports: inside each host, then across hosts.
//
// For a homogeneous job of C hosts with L ranks each, `local` connects the L ranks of this
// host and `cross` the C ranks that have this rank's local rank, one per host. The data is the
// flat ring's chunk list (chunks.size() == L * C, the executor's chunk-major layout), grouped
// into L super-chunks of C consecutive chunks each:
//   1. reduce-scatter of the super-chunks inside the host (ring over `local`): local rank l ends
//      up holding the host's sum of super-chunk j = RingOwnedChunk(l, L);
//   2. allreduce of that super-chunk across hosts (ring over `cross`, its C chunks as the ring's
//      chunks), `postscale` applied once here. Every local rank does this for its own
//      super-chunk at the same time, so all L ranks of a host use the network in parallel and
//      each host sends 2 (C-1)/C of the data once, not once per rank;
//   3. allgather of the super-chunks inside the host (ring over `local`).
// Determinism: the order in which contributions are added to an element depends only on the
// index of its chunk (which super-chunk, stage 1; which chunk within it, stage 2), never on
// timing or on what else was fused, so a tensor reduced alone or inside any fused batch gives
// identical bits, on every rank. The order differs from the flat ring's, so floating-point
// results may differ from it in the last bits; integer results are identical.
// Each ring has its own segment size: inside the host and across hosts the best differ.
// L == 1 or C == 1 degenerate to the flat ring over the other transport.
#pragma once

#include <functional>
#include <vector>

#include "comm/ring.h"
#include "comm/transport.h"

namespace hvdl {

// `phase`, where set, is told each stage as it starts (kPhases: the timeline's names).
Status HierarchicalAllreduce(Transport* local, Transport* cross,
                             const std::vector<std::vector<Span>>& chunks, DataType dtype,
                             ReduceOp op, double postscale, size_t local_segment_bytes,
                             size_t cross_segment_bytes, RingStats* stats,
                             const std::function<void(const char*)>& phase = nullptr);

// Allgather of blocks in rank order (`counts` per rank, `recv` the whole result, this rank's
// block copied in from `send` first) over the same two transports: `columns[l]` lists the
// ranks of local rank l in the cross transport's member order (Fabric::LocalRankColumns).
//   1. across hosts, the ranks of equal local rank gather their blocks (ring over `cross`);
//   2. inside the host, each local rank passes on the column it gathered (ring over `local`).
// Each host's link carries its own blocks out and the other hosts' in once, where the flat ring
// sends (n-1)/n of everything over each of its links that crosses hosts.
Status HierarchicalAllgatherv(Transport* local, Transport* cross, const void* send, void* recv,
                              const std::vector<int64_t>& counts, DataType dtype,
                              const std::vector<std::vector<int>>& columns,
                              size_t local_segment_bytes, size_t cross_segment_bytes);

// Reduce-scatter, the allgather's mirror: `send` holds every rank's block (`counts`, in rank
// order), `recv` gets this rank's block reduced over all ranks.
//   1. inside the host, a ring reduce-scatter of the columns: local rank l gets the host's sum
//      of the blocks of column l (the ranks of local rank l on every host);
//   2. across hosts, a ring reduce-scatter of that column among its ranks: each gets its block.
// Each host's link carries the other hosts' shares out and its own in once. The order of
// additions depends only on the layout, not on timing.
Status HierarchicalReduceScatter(Transport* local, Transport* cross, const void* send, void* recv,
                                 const std::vector<int64_t>& counts, DataType dtype, ReduceOp op,
                                 const std::vector<std::vector<int>>& columns,
                                 size_t local_segment_bytes, size_t cross_segment_bytes);

}  // namespace hvdl
