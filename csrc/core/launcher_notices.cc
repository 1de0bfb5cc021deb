#include "core/launcher_notices.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

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

// The process's one reader of the pipe and its subscribers (see the header for why one).
// Callbacks run under the mutex: Unsubscribe returning means none runs, as joining a reader
// thread did. They must not subscribe or unsubscribe (Context::Abort does neither).
class NoticeHub {
 public:
  static NoticeHub& Get() {
    static NoticeHub* hub = new NoticeHub();  // never destroyed: its reader may outlive main
    return *hub;
  }

  uint64_t Subscribe(int fd, LauncherNotices::Callback cb) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      std::thread([this, fd] { Read(fd); }).detach();  // blocks in poll/read for ever
      started_ = true;
    }
    const uint64_t id = ++last_id_;
    LauncherNotices::Callback& mine = subscribers_[id] = std::move(cb);
    std::deque<std::string> held;
    held.swap(held_);
    for (std::string& line : held) {
      if (Current(&line)) mine(line);
    }
    return id;
  }

  void Unsubscribe(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    subscribers_.erase(id);
  }

 private:
  static constexpr size_t kHeld = 64;  // lines kept while nobody listens (the newest)

  // Until the wrapper closes the pipe; a line may arrive in pieces.
  void Read(int fd) {
    std::string pending;
    char buf[4096];
    while (true) {
      pollfd p{fd, POLLIN, 0};  // (the descriptor may be non-blocking)
      if (::poll(&p, 1, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return;  // the wrapper is gone; the launcher watch handles that
      pending.append(buf, static_cast<size_t>(n));
      for (size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
        std::string line = pending.substr(0, eol);
        pending.erase(0, eol + 1);
        if (!line.empty()) Deliver(std::move(line));
      }
    }
  }

  void Deliver(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (subscribers_.empty()) {  // between two inits: the next Context gets it
      held_.push_back(std::move(line));
      if (held_.size() > kHeld) held_.pop_front();
      return;
    }
    if (!Current(&line)) return;
    for (auto& kv : subscribers_) kv.second(line);
  }

  std::mutex mu_;
  bool started_ = false;
  uint64_t last_id_ = 0;
  std::map<uint64_t, LauncherNotices::Callback> subscribers_;
  std::deque<std::string> held_;
};

}  // namespace

void LauncherNotices::SetRound(int round) { g_round.store(round); }

int LauncherNotices::DescriptorFromEnv() {
  static const int fd = ClaimDescriptor();
  return fd;
}

LauncherNotices::LauncherNotices(Callback on_notice) {
  const int fd = DescriptorFromEnv();
  if (fd >= 0) id_ = NoticeHub::Get().Subscribe(fd, std::move(on_notice));
}

LauncherNotices::~LauncherNotices() {
  if (id_ != 0) NoticeHub::Get().Unsubscribe(id_);
}

}  // namespace hvdl
