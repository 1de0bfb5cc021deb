#include "core/launcher_notices.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

namespace hvdl {
namespace {

// The descriptor HVDL_NOTICE_FD names, if it is a pipe open in this process. Claimed once per
// process (a later Context reuses it) and made close-on-exec, so that programs this rank starts
// do not inherit it; horovodlite.init() then removes the variable from the environment, whose
// number could name an unrelated pipe in such a program.
int ClaimDescriptor() {
  const char* value = std::getenv("HVDL_NOTICE_FD");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(value, &end, 10);
  struct stat st {};
  if (*end != '\0' || fd < 0 || fd > 1 << 20 || ::fstat(static_cast<int>(fd), &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    return -1;
  }
  ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  return static_cast<int>(fd);
}

std::atomic<int> g_round{-1};

// A line's "@<round> " prefix: false (drop it) when it names a round before this process's;
// otherwise the prefix is removed.
bool Current(std::string* line) {
  if (line->empty() || (*line)[0] != '@') return true;
  const size_t space = line->find(' ');
  if (space == std::string::npos) return true;
  char* end = nullptr;
  const long round = std::strtol(line->c_str() + 1, &end, 10);
  if (end != line->c_str() + space) return true;
  line->erase(0, space + 1);
  return round >= g_round.load();
}

}  // namespace

void LauncherNotices::SetRound(int round) { g_round.store(round); }

int LauncherNotices::DescriptorFromEnv() {
  static const int fd = ClaimDescriptor();
  return fd;
}

LauncherNotices::LauncherNotices(Callback on_notice) : on_notice_(std::move(on_notice)) {
  const int fd = DescriptorFromEnv();
  if (fd < 0 || ::pipe2(wake_, O_CLOEXEC) != 0) return;
  thread_ = std::thread([this, fd] { Read(fd); });
}

LauncherNotices::~LauncherNotices() {
  if (thread_.joinable()) {
    const char stop = 0;
    while (::write(wake_[1], &stop, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : wake_) {
    if (fd >= 0) ::close(fd);
  }
}

// Until the destructor wakes us; a line may arrive in pieces.
void LauncherNotices::Read(int fd) {
  std::string pending;
  char buf[4096];
  while (true) {
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int ready = ::poll(p, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0 || p[1].revents != 0) return;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the wrapper is gone; the launcher watch handles that
    pending.append(buf, static_cast<size_t>(n));
    for (size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
      std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      if (!line.empty() && Current(&line)) on_notice_(line);
    }
  }
}

}  // namespace hvdl
