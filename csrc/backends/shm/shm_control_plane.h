// ShmControlPlane: the negotiation's ControlPlane among the processes of one host, over a
// ShmGroup whose members are all of them in rank order (member 0 = rank 0 of the control plane).
//
// Bitwise OR, without a root and without a message. Each member owns, in the group's
// bitwise-OR area, a round counter and two word slots (round parity 0 and 1):
//   StartBitwiseOr (round k = this member's k-th): copy the words into slot k mod 2, then store
//     k into the counter with release semantics; return.
//   TestBitwiseOr: not done while some member's counter (acquire) is below k; once all reached
//     k, OR every member's slot k mod 2 into the caller's words - each member computes the
//     result itself.
// Why two slots suffice: a member starts round k+2 (overwriting slot k mod 2) only after its
// round k+1 completed, i.e. after every member started round k+1, which each did only after
// finishing reading round k. So a fast member may run one round ahead of a slow one that is
// still reading, never two. Every member must pass the same word count (checked: kMismatch).
//
// Gather and Broadcast (blocking, member 0 the root) travel over a ShmTransport of the same
// group: tag 0 carries Gather, tag 1 Broadcast; each string goes as an 8-byte length, then its
// bytes. The group needs rings only between member 0 and the others (GroupOptions: a star with
// two tags, so the control plane's segment stays small at any size).
//
// Liveness and cancel as the transport: ShmGroup::Cancel makes every wait return kAborted;
// a TestBitwiseOr that has waited more than ~64 ms checks (every ~64 ms) whether the process of
// a member that has not started the round is gone, and returns kPeerFailed naming it; the
// blocking calls fail the same way through the transport.
//
// Contract (ControlPlane's): background thread only; one bitwise OR outstanding at a time, its
// words owned by the caller and left untouched until TestBitwiseOr reports done.
#pragma once

#include <chrono>
#include <memory>

#include "backends/shm/shm_group.h"
#include "backends/shm/shm_transport.h"
#include "comm/control_plane.h"

namespace hvdl {

class ShmControlPlane : public ControlPlane {
 public:
  // Options for the group: a star with two tags and four slots per ring, and a bitwise-OR area
  // of `max_words` words per round (the controller's: 1 + 2 ceil(cache capacity / 64)).
  static ShmGroupOptions GroupOptions(size_t max_words);

  // Over `group` (created with GroupOptions or any layout with rings between member 0 and the
  // others on tags 0 and 1 and a bitwise-OR area). Non-blocking.
  explicit ShmControlPlane(std::shared_ptr<ShmGroup> group);
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  // Non-blocking. Errors: n above the group's bitwise_or_words (kInvalidArgument naming both),
  // one already outstanding (kInternal), cancelled (kAborted).
  Status StartBitwiseOr(uint64_t* words, size_t n) override;
  // Non-blocking. Errors: cancelled (kAborted), a member's process gone (kPeerFailed), members
  // with different word counts (kMismatch).
  Status TestBitwiseOr(bool* done) override;
  // Blocking; see the protocol. Errors: the transport's.
  Status Gather(const std::string& send, std::vector<std::string>* recv) override;
  Status Broadcast(std::string* data) override;

  ShmGroup* group() const { return group_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<int> Missing() const;

  std::shared_ptr<ShmGroup> group_;
  ShmTransport transport_;
  uint64_t round_ = 0;  // bitwise-OR rounds this member started
  uint64_t* words_ = nullptr;
  size_t n_ = 0;
  bool pending_ = false;
  Clock::time_point next_check_;
};

}  // namespace hvdl
