#include "core/affinity.h"

#include <mutex>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "common/logging.h"

namespace hvdl {

int ChooseRankCpu(Toggle mode, const std::vector<int>& allowed, int local_rank, int local_size) {
  const int n = static_cast<int>(allowed.size());
  if (mode == Toggle::kOff || n == 0 || local_rank < 0 || local_size <= 0) return -1;
  if (mode == Toggle::kAuto && n != local_size) return -1;
  return allowed[static_cast<size_t>(local_rank % n)];
}

int BindCallingThread(Toggle mode, int local_rank, int local_size) {
#if defined(__linux__)
  // The mask before any pinning: a re-initialised rank may have another local rank, or the knob
  // another value (0 then restores the mask).
  static std::once_flag once;
  static bool saved = false;
  static cpu_set_t original;
  static std::vector<int> allowed;
  std::call_once(once, [] {
    CPU_ZERO(&original);
    if (pthread_getaffinity_np(pthread_self(), sizeof(original), &original) != 0) return;
    saved = true;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &original)) allowed.push_back(c);
    }
  });
  if (!saved) return -1;
  const int cpu = ChooseRankCpu(mode, allowed, local_rank, local_size);
  cpu_set_t set = original;
  if (cpu >= 0) {
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
  }
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    HVDL_LOG(Debug) << "HOROVOD_BIND_RANKS: could not set this thread's CPUs; left as they were";
    return -1;
  }
  return cpu;
#else
  (void)mode;
  (void)local_rank;
  (void)local_size;
  return -1;
#endif
}

}  // namespace hvdl
