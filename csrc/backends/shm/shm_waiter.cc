#include "backends/shm/shm_waiter.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace hvdl {
namespace {

inline void CpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

ShmWaiter::ShmWaiter(ShmGroup* group, int peer) : group_(group), peer_{peer} {
  Progressed();
  group_->NoteCpu();
}

void ShmWaiter::Progressed() {
  quiet_since_ = Clock::now();
  next_check_ = quiet_since_ + kLivenessPeriod;
  sleep_ = kFirstSleep;
}

Status ShmWaiter::Idle() {
  HVDL_RETURN_IF_ERROR(group_->cancelled());
  const auto now = Clock::now();
  if (now >= next_check_) {
    next_check_ = now + kLivenessPeriod;
    HVDL_RETURN_IF_ERROR(group_->CheckPeers(peer_));
  }
  const auto quiet = now - quiet_since_;
  if (quiet < kSpin && !group_->SharesCpuWith(peer_[0])) {
    for (int i = 0; i < 16; ++i) CpuPause();
  } else if (quiet < kYield) {
    group_->NoteCpu();
    sched_yield();
  } else {
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }
  return Status::Ok();
}

}  // namespace hvdl
