// MpiTransport: the ring's Transport over MPI point-to-point on one data communicator.
//
// Single copy on one host. Between two members that run on one host, when the kernel lets them
// read each other's memory (Linux cross-memory attach, process_vm_readv; the probe in the
// constructor checks each such pair), a large ring message does not travel through MPI: the sender
// posts a small descriptor - its pid-relative addresses and lengths - and the receiver copies
// straight from the sender's tensors into its own destination with one system call, then
// acknowledges, which is when the sender's request completes. Open MPI's own single-copy path
// (CMA) only serves contiguous buffers; a fused batch is many tensors, and the hindexed message
// MPI builds for it is copied twice (into shared memory and out again), which measured 3-4x
// slower than one contiguous exchange of the same bytes. Small messages are carried inside the
// descriptor; messages with too many pieces go as ordinary MPI messages after it.
// Members on different hosts always exchange MPI messages (TCP between machines); a job that
// spans hosts keeps single copy between the ranks that share one. HOROVOD_RING_CMA=0 turns
// single copy off (every rank must agree).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/transport.h"

namespace hvdl {

class MpiTransport : public Transport {
 public:
  // Collective over `comm` when `single_copy` is requested (it probes every member).
  MpiTransport(MPI_Comm comm, bool single_copy);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Whether messages with `peer` travel by single copy (both sides agree), and with how many
  // members this rank exchanges that way.
  bool single_copy(int peer) const { return !peers_.empty() && peers_[static_cast<size_t>(peer)]; }
  int single_copy_peers() const { return single_copy_peers_; }
  Status Isend(const void* buf, size_t bytes, int peer, int* request) override;
  Status Irecv(void* buf, size_t bytes, int peer, int* request) override;
  Status IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status Wait(int request) override;

 private:
  // One posted operation. A plain MPI transfer uses `mpi` only; a single-copy exchange adds the
  // descriptor buffer, the receiver's destination and, on the sender, the acknowledgement (or the
  // separate data message when the descriptor could not describe the data).
  struct Request {
    MPI_Request mpi = MPI_REQUEST_NULL;
    MPI_Request second = MPI_REQUEST_NULL;
    bool receive_descriptor = false;
    int peer = 0;
    std::vector<uint64_t> descriptor;
    std::vector<Span> local;  // receiver's destination, counts in bytes
  };

  // A free slot (its index in `*id`) for a request with `peer`; descriptor/local keep their
  // capacity for reuse.
  Request& NewRequest(int peer, bool receive_descriptor, int* id);
  void ProbeSingleCopy();
  Status PostPlain(bool send, const std::vector<Span>& spans, int peer, int tag,
                   MPI_Request* req);
  Status PostSend(const std::vector<Span>& spans, int peer, int* request);
  Status PostRecv(const std::vector<Span>& spans, int peer, int* request);
  Status CompleteReceive(Request* r);
  // An hindexed byte datatype over absolute addresses (used with MPI_BOTTOM).
  Status SpanType(const std::vector<Span>& spans, MPI_Datatype* type);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<uint8_t> peers_;  // per member: 1 if messages with it go by single copy
  int single_copy_peers_ = 0;
  std::vector<int64_t> pids_;  // per member on this host, for process_vm_readv (0 elsewhere)
  uint64_t probe_word_ = 0;
  std::vector<Request> requests_;
  std::vector<int> free_;
};

}  // namespace hvdl
