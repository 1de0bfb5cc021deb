// MpiTransport: the ring's Transport over MPI_Isend/MPI_Irecv on one data communicator.
#pragma once

#include <mpi.h>

#include <vector>

#include "comm/transport.h"

namespace hvdl {

class MpiTransport : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status Isend(const void* buf, size_t bytes, int peer, int* request) override;
  Status Irecv(void* buf, size_t bytes, int peer, int* request) override;
  Status IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status Wait(int request) override;

 private:
  int Slot(MPI_Request req);
  Status PostSpans(bool send, const std::vector<Span>& spans, size_t esize, int peer,
                   int* request);
  // An hindexed byte datatype over absolute addresses (used with MPI_BOTTOM).
  Status SpanType(const std::vector<Span>& spans, size_t esize, MPI_Datatype* type);
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MPI_Request> requests_;
  std::vector<int> free_;
};

}  // namespace hvdl
