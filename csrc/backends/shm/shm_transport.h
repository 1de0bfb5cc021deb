// ShmTransport: the Transport between the processes of one host, over the rings of a ShmGroup
// (backends/shm/shm_group). Members of the group are members of the transport; SingleCopyTransport
// sits on top of it for large messages, so what travels here is mostly control traffic and
// single-copy descriptors - and everything, where the kernel forbids cross-memory reads.
//
// Protocol. A message from src to dst on tag t travels through the ring (src, dst, t) as
// fragments of at most ShmRing::kSlotPayload bytes, each carrying the message's total size and
// its own offset, in order; messages on one ring follow each other in posting order.
//   PostSend / PostRecv queue the operation on its (peer, tag) queue and make what progress they
//   can at once (a small send usually completes in PostSend: its bytes are in shared memory);
//   they never block.
//   Wait runs the progress engine until its request completes: the oldest pending send of every
//   (dst, tag) queue writes fragments into the free slots of its ring, the oldest pending
//   receive of every (src, tag) queue copies arrived fragments into its spans. Every queue moves
//   in every Wait, so two members that send to each other before receiving never deadlock,
//   whatever the message sizes (the rings are small; a large message streams through).
//   Between polls that moved nothing the wait backs off (backends/shm/shm_waiter: spin, yield,
//   short sleeps), honours ShmGroup::Cancel and checks every ~64 ms that the peer of the
//   awaited request is alive.
// A receive may be larger than its message (the rest of its spans is left as it was). A message
// larger than its receive fails that receive, naming the peer and both sizes; its fragments are
// still consumed, so the stream stays in step and later messages are received normally.
// A dead peer or a cancelled group fails the transport: that Wait and every later call return
// the error (kPeerFailed naming the member, or kAborted with the reason), and no buffer of an
// unfinished request is touched again.
//
// Contract (Transport's): background thread only; buffers stay the caller's and valid until
// Wait returns; a request id is released by its Wait; nothing throws.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "backends/shm/shm_group.h"
#include "backends/shm/shm_ring.h"
#include "comm/transport.h"

namespace hvdl {

class ShmTransport : public Transport {
 public:
  // Over all rings of `group` (its tags; a star group only between member 0 and the others).
  // Non-blocking.
  explicit ShmTransport(std::shared_ptr<ShmGroup> group);
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  // Errors (returned at once): a peer or tag without a ring (kInvalidArgument), a failed
  // transport (its failure).
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  // Blocking (see the protocol). Errors: the request's own (a message larger than the
  // receive), the transport's failure, kInternal for an unknown request.
  Status Wait(int request) override;
  // Non-blocking: one pass of the progress engine; true while some request is unfinished.
  bool Progress() override;
  bool Ready(int request) override;

  ShmGroup* group() const { return group_.get(); }

 private:
  // One posted message. Spans are in bytes; the cursor (piece, within) follows `done`.
  struct Op {
    std::vector<Span> spans;
    uint64_t room = 0;   // bytes the spans hold (a send's message size)
    uint64_t total = 0;  // a receive's message size, from its first fragment
    uint64_t done = 0;   // bytes written / read so far
    size_t piece = 0;
    int64_t within = 0;
    int peer = 0;
    int tag = 0;
    bool send = false;
    bool started = false;
    bool complete = false;
    bool in_use = false;
    Status status;
  };
  // The pending operations of one (peer, tag) in posting order, and this side's ring handle.
  struct Queue {
    ShmRing ring;
    std::deque<int> ops;
    bool listed = false;  // in active_
  };

  Status Post(bool send, const std::vector<Span>& spans, size_t esize, int peer, int tag,
              int* request);
  size_t QueueIndex(bool send, int peer, int tag) const;
  bool Advance(size_t queue);  // moves what it can; true if anything moved
  bool AdvanceSend(Queue* q);
  bool AdvanceRecv(Queue* q);
  bool AdvanceAll();           // Advance over every queue with pending operations
  void FailAll(const Status& cause);
  std::string Describe(const Op& op) const;

  std::shared_ptr<ShmGroup> group_;
  std::vector<Queue> queues_;  // sends (peer, tag), then receives (peer, tag)
  std::vector<size_t> active_;
  std::vector<Op> ops_;
  std::vector<int> free_;
  Status failure_;
  std::chrono::steady_clock::time_point next_liveness_check_{};  // Progress's
};

}  // namespace hvdl
