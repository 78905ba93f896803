// Minimal leveled logging to stderr (Abseil 20220623 has no absl/log).
// Usage: KVC_LOG(INFO) << "listening on " << address;
#pragma once

#include <sstream>

namespace kvc {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2 };

// Messages below this severity are dropped. Default kInfo; env KVC_LOG_LEVEL=warning|error.
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

namespace internal {

// One log line: written atomically (single write) when destroyed.
class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  LogMessage(const LogMessage&) = delete;  // a copy would log the line twice
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace internal
}  // namespace kvc

#define KVC_LOG_SEVERITY_INFO ::kvc::LogSeverity::kInfo
#define KVC_LOG_SEVERITY_WARNING ::kvc::LogSeverity::kWarning
#define KVC_LOG_SEVERITY_ERROR ::kvc::LogSeverity::kError

#define KVC_LOG(level)                                      \
  if (KVC_LOG_SEVERITY_##level < ::kvc::MinLogSeverity()) { \
  } else                                                    \
    ::kvc::internal::LogMessage(KVC_LOG_SEVERITY_##level, __FILE__, __LINE__).stream()
