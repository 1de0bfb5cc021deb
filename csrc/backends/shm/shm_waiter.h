// ShmWaiter: how a member waits for its shared-memory peers without burning the CPU that the
// training threads need, and without waiting forever for a peer that died.
//
// A wait is a loop of polls; after each poll that moved nothing the caller calls Idle(), which
//   - spins (CPU pause) for the first kSpin of a quiet spell: a peer that is itself waiting
//     answers within a few microseconds, and any sleep costs more than that (a 1 us sleep is
//     15-20 us on small VMs) - unless the peer last ran on this very CPU (ShmGroup::NoteCpu:
//     every wait notes its CPU): then it cannot answer while we spin, so we yield at once
//     (a 4-byte round trip between two members that share a core: 25 us -> a few us);
//   - then yields the core (sched_yield) until kYield: the peer may need this very core;
//   - then sleeps, from kFirstSleep doubling up to kMaxSleep, so a long wait costs a small
//     fraction of a core yet reacts within ~0.1 ms;
//   - checks the group's Cancel flag on every call, and every kLivenessPeriod of a quiet spell
//     asks the group whether the process of the member waited for is gone (a /proc read).
// Progressed() ends the quiet spell (back to spinning): a stream of fragments keeps both sides
// polling at full speed.
//
// One waiter per wait, used by one thread; the group must outlive it.
#pragma once

#include <chrono>
#include <vector>

#include "backends/shm/shm_group.h"
#include "common/status.h"

namespace hvdl {

class ShmWaiter {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSpin{10};
  static constexpr std::chrono::microseconds kYield{200};
  static constexpr std::chrono::microseconds kFirstSleep{8};
  static constexpr std::chrono::microseconds kMaxSleep{128};
  static constexpr std::chrono::milliseconds kLivenessPeriod{64};

  // Waits for member `peer` of `group`.
  ShmWaiter(ShmGroup* group, int peer);
  // After a poll that found nothing: pauses as above. Returns kAborted once the group was
  // cancelled, kPeerFailed naming the peer once its process is gone; Ok to poll again.
  Status Idle();
  // After a poll that moved something.
  void Progressed();

 private:
  ShmGroup* group_;
  std::vector<int> peer_;
  Clock::time_point quiet_since_;
  Clock::time_point next_check_;
  std::chrono::microseconds sleep_;
};

}  // namespace hvdl
