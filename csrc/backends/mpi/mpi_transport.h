// MpiTransport: the Transport over MPI point-to-point on one communicator.
//
// A message of one span is a plain MPI_Isend/MPI_Irecv of bytes; a message of several spans
// travels as ONE MPI message described by an hindexed byte datatype over their absolute
// addresses, so a fused batch is never packed by us. Tag t of the interface is MPI tag
// kFirstTag + t; the communicator carries no other point-to-point traffic. Single copy between
// the ranks of one host is a layer above this one (comm/single_copy_transport).
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
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;

  static constexpr int kFirstTag = 7;

 private:
  Status Post(bool send, const std::vector<Span>& spans, size_t esize, int peer, int tag,
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
