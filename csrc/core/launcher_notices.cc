#include "core/launcher_notices.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace hvdl {

int LauncherNotices::DescriptorFromEnv() {
  const char* value = std::getenv("HVDL_NOTICE_FD");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(value, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1 << 20) return -1;
  if (::fcntl(static_cast<int>(fd), F_GETFD) < 0) return -1;  // not open in this process
  return static_cast<int>(fd);
}

LauncherNotices::LauncherNotices(Callback on_notice) : on_notice_(std::move(on_notice)) {
  const int fd = DescriptorFromEnv();
  if (fd >= 0) thread_ = std::thread([this, fd] { Read(fd); });
}

LauncherNotices::~LauncherNotices() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

// Polls with a timeout so that the destructor can stop it; a line may arrive in pieces.
void LauncherNotices::Read(int fd) {
  std::string pending;
  char buf[4096];
  while (!stop_) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 200);
    if (ready < 0 && errno != EINTR) return;
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the wrapper is gone; the launcher watch handles that
    pending.append(buf, static_cast<size_t>(n));
    for (size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
      std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      if (!line.empty()) on_notice_(line);
    }
  }
}

}  // namespace hvdl
