// SingleCopyTransport: single copy between the members that share a host, as a layer over any
// Transport (MPI point-to-point today).
//
// Between two members on one host, when the kernel lets them read each other's memory (Linux
// cross-memory attach, process_vm_readv; the probe in the constructor checks each such pair), a
// message does not travel through the base transport: the sender posts a small descriptor - its
// addresses and lengths - and the receiver copies straight from the sender's tensors into its own
// destination with one system call, then acknowledges, which is when the sender's request
// completes. MPI's own single-copy path (CMA) serves contiguous buffers only; a fused batch is
// many tensors, and the hindexed message MPI builds for it is copied twice (into shared memory
// and out), which measured 3-4x slower than one contiguous exchange of the same bytes. Small
// messages are carried inside the descriptor; messages with too many pieces go as ordinary
// messages after it. Members on other hosts exchange base-transport messages; a job that spans
// hosts keeps single copy between the ranks that share one.
//
// Channels of the base transport: tag 0 carries plain messages (peers without single copy),
// tag 1 descriptors (in posting order) and the probe, tag 2 acknowledgements, tag 3 the data of
// messages too scattered for a descriptor. This layer offers tag 0 only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace hvdl {

class SingleCopyTransport : public Transport {
 public:
  // `hosts[i]`: the host member i runs on (the probe pairs only members of one host). Collective
  // over the members of `base` (the probe exchanges messages with the members of this host).
  SingleCopyTransport(std::unique_ptr<Transport> base, const std::vector<std::string>& hosts);
  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }
  // Whether messages with `peer` travel by single copy (both sides agree).
  bool single_copy(int peer) const { return peers_[static_cast<size_t>(peer)] != 0; }
  int single_copy_peers() const override { return single_copy_peers_; }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;
  Status WaitUntil(int request, std::chrono::steady_clock::time_point deadline) override;
  // The base's (a single-copy receive copies in its own Wait, which a peer never waits for).
  bool Progress() override { return base_->Progress(); }
  bool Ready(int request) override;

 private:
  // One posted operation: a plain one is `first` only; a single-copy send adds the
  // acknowledgement's receive (or the separate data message) as `second`; a single-copy receive
  // holds the descriptor buffer and the destination.
  struct Request {
    int first = -1;
    int second = -1;
    bool receive_descriptor = false;
    int peer = 0;
    std::vector<uint64_t> descriptor;
    std::vector<Span> local;  // receiver's destination, counts in bytes
  };

  Request& NewRequest(int peer, bool receive_descriptor, int* id);
  Status Posted(int id, Status s);
  void Probe(const std::vector<std::string>& hosts);
  // A receive's second half, once its descriptor arrived: the copy, or the separate message.
  Status FinishReceive(Request* r);
  Status Finish(int request, Status s);

  std::unique_ptr<Transport> base_;
  std::vector<uint8_t> peers_;  // per member: 1 if messages with it go by single copy
  int single_copy_peers_ = 0;
  std::vector<int64_t> pids_;   // per member on this host, for process_vm_readv (0 elsewhere)
  uint64_t probe_word_ = 0;
  std::vector<Request> requests_;
  std::vector<int> free_;
};

}  // namespace hvdl
