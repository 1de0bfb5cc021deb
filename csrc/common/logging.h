// Logging: every line carries "[hvdl rank/size host:pid]" and an optional timestamp.
//
// The level and identity are process-wide (like NCCL_DEBUG): they are set once by Context at init
// from the parsed Config and read lock-free afterwards. HVDL_CHECK guards internal invariants and
// aborts with file:line; user mistakes never go through it (they return a Status).
#pragma once

#include <sstream>
#include <string>

namespace hvdl {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

const char* LogLevelName(LogLevel level);

// Sets the prefix identity and level; called by Context::Init before the loop starts.
void ConfigureLogging(int rank, int size, LogLevel level, bool hide_time);
bool LogEnabled(LogLevel level);
// The "rank/size host:pid" identity used in log lines and error messages.
std::string LogIdentity();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace hvdl

// A `for` rather than an if/else so it is safe inside an unbraced `if ... else`.
#define HVDL_LOG(level)                                                          \
  for (bool _hvdl_on = ::hvdl::LogEnabled(::hvdl::LogLevel::k##level); _hvdl_on; \
       _hvdl_on = false)                                                         \
  ::hvdl::LogMessage(::hvdl::LogLevel::k##level, __FILE__, __LINE__).stream()

#define HVDL_CHECK(cond, msg)                                                         \
  do {                                                                                \
    if (!(cond)) ::hvdl::CheckFailed(__FILE__, __LINE__, #cond, (msg));               \
  } while (0)
