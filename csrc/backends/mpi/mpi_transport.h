// MpiTransport: the Transport over MPI point-to-point on one communicator.
//
// A message of one span is a plain MPI_Isend/MPI_Irecv of bytes; a message of several spans
// travels as ONE MPI message described by an hindexed byte datatype over their absolute
// addresses, so a fused batch is never packed by us. Tag t of the interface is MPI tag
// kFirstTag + t; the communicator carries no other point-to-point traffic. Single copy between
// the ranks of one host is a layer above this one (comm/single_copy_transport).
//
// MPI has no timeout of its own, so the cleanup after an error (WaitUntil) tests instead of
// waiting, and at the deadline cancels the request. A cancelled request is released. One that
// neither completes nor cancels (an unmatched send MPI cannot cancel) stays MPI's - with its
// buffer - and the transport is broken from then on: every later post fails, naming the peer
// and the request, instead of waiting for ever behind it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
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
  Status WaitUntil(int request, std::chrono::steady_clock::time_point deadline) override;

  static constexpr int kFirstTag = 7;

 private:
  Status Post(bool send, const std::vector<Span>& spans, size_t esize, int peer, int tag,
              int* request);
  // An hindexed byte datatype over absolute addresses (used with MPI_BOTTOM).
  Status SpanType(const std::vector<Span>& spans, size_t esize, MPI_Datatype* type);
  void Release(int request);
  std::string Describe(int request) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  struct Posted {
    int peer = -1;
    bool send = false;
    int64_t bytes = 0;
  };
  std::vector<MPI_Request> requests_;
  std::vector<Posted> posted_;  // per request: what it is, for the messages
  std::vector<int> free_;
  Status broken_;               // set once a request could be neither completed nor cancelled
};

}  // namespace hvdl
