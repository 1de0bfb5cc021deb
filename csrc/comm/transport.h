// Transport: non-blocking point-to-point byte transfer between members of one group.
//
// The ring algorithm depends only on this, so MPI point-to-point (backends/mpi/mpi_transport) and
// the in-process test transport (comm/local_transport) share one implementation of the algorithm.
// Background thread only. Buffers stay owned by the caller and must stay valid until Wait returns.
#pragma once

#include <cstddef>
#include <vector>

#include "common/status.h"
#include "common/tensor_ref.h"

namespace hvdl {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Post a send/receive of `bytes` to/from member `peer`; `*request` identifies it for Wait.
  // Messages between one pair of members are received in the order they were sent.
  virtual Status Isend(const void* buf, size_t bytes, int peer, int* request) = 0;
  virtual Status Irecv(void* buf, size_t bytes, int peer, int* request) = 0;
  // One message made of (or landing in) several spans of `esize`-byte elements, in order: a
  // fused batch travels without being packed by us. The peer may use the other form (a single
  // buffer of the same total size) for the matching operation.
  virtual Status IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                            int* request) = 0;
  virtual Status IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                            int* request) = 0;
  // Blocks until the request completed and releases it.
  virtual Status Wait(int request) = 0;
};

}  // namespace hvdl
