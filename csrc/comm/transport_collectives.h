// The gather-type collectives over a Transport, for transports without native collectives of
// their own. With the ring (comm/ring) they make every collective of a process set runnable on
// nothing but point-to-point messages, so a new transport needs no collectives code.
//
// Layouts are the DataBackend's (comm/data_backend.h): blocks in member order, counts in
// elements of `dtype`. Every function is collective over the transport's members, blocks until
// this rank's result is in place, and moves each block once per link it crosses:
//   allgatherv     ring (reduce-free half of the ring allreduce): n-1 steps, block i starting at
//                  member i, segmented;
//   reducescatter  ring reduce-scatter on a copy of the input (or in place on scratch the caller
//                  gives up), block i completed at member i;
//                  the order of additions depends on the member only, so results are identical
//                  on every run;
//   broadcast      binomial tree from `root`: log2(n) rounds, each member receiving once;
//   alltoallv      every pair exchanges its blocks directly, all posted at once.
// Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "common/types.h"

namespace hvdl {

Status TransportAllgatherv(Transport* t, const void* send, void* recv,
                           const std::vector<int64_t>& counts, DataType dtype,
                           size_t segment_bytes);
Status TransportReduceScatter(Transport* t, const void* send, void* recv,
                              const std::vector<int64_t>& counts, DataType dtype, ReduceOp op,
                              size_t segment_bytes);
// The same on `work`, which it reduces in place (its contents are lost): no copy of the input.
Status TransportReduceScatterInPlace(Transport* t, void* work, void* recv,
                                     const std::vector<int64_t>& counts, DataType dtype,
                                     ReduceOp op, size_t segment_bytes);
Status TransportBroadcast(Transport* t, void* buf, int64_t count, DataType dtype, int root);
Status TransportAlltoallv(Transport* t, const void* send, const std::vector<int64_t>& send_counts,
                          void* recv, const std::vector<int64_t>& recv_counts, DataType dtype);

}  // namespace hvdl
