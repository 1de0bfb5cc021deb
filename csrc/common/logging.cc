#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace hvdl {
namespace {

struct LogState {
  std::atomic<int> level{static_cast<int>(LogLevel::kWarning)};
  std::atomic<bool> hide_time{false};
  std::mutex mu;  // guards identity and serialises writes so lines never interleave
  std::string identity = "?/?";
};

LogState& State() {
  static LogState* state = new LogState();  // leaked on purpose: usable during static teardown
  return *state;
}

std::string HostPid() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "?";
}

void ConfigureLogging(int rank, int size, LogLevel level, bool hide_time) {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.identity = std::to_string(rank) + "/" + std::to_string(size) + " " + HostPid();
  s.level.store(static_cast<int>(level));
  s.hide_time.store(hide_time);
}

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= State().level.load(std::memory_order_relaxed);
}

std::string LogIdentity() {
  LogState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.identity;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  LogState& s = State();
  std::string stamp;
  if (!s.hide_time.load()) {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
              1000000;
    char buf[64];
    std::tm tm_buf;
    localtime_r(&t, &tm_buf);
    std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm_buf);
    char full[80];
    std::snprintf(full, sizeof(full), "%s.%06ld ", buf, static_cast<long>(us));
    stamp = full;
  }
  const char* base = file_;
  for (const char* p = file_; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  std::fprintf(stderr, "%s[hvdl %s] %s %s:%d: %s\n", stamp.c_str(), s.identity.c_str(),
               LogLevelName(level_), base, line_, stream_.str().c_str());
  std::fflush(stderr);
}

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "[hvdl %s] internal invariant failed at %s:%d: %s (%s)\n",
               LogIdentity().c_str(), file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace hvdl
