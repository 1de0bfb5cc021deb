#include "core/launcher_watch.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/logging.h"

namespace hvdl {
namespace {

bool UnderLauncher() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace

void WatchLauncher(int rank) {
  static std::once_flag once;
  std::call_once(once, [rank] {
    if (!UnderLauncher()) return;
    const pid_t parent = ::getppid();
    if (parent <= 1) return;  // already orphaned at start: nothing to watch
    // Detached: it only sleeps and makes system calls, so it may outlive everything else.
    std::thread([parent, rank] {
      while (::getppid() == parent) std::this_thread::sleep_for(std::chrono::seconds(1));
      HVDL_LOG(Error) << "the launcher (pid " << parent << ") that started rank " << rank
                      << " exited without stopping it; stopping rank " << rank
                      << " (SIGTERM, then exit in 5 s)";
      ::kill(::getpid(), SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(1);
    }).detach();
  });
}

}  // namespace hvdl
