#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <string>

#include "common/check.h"

namespace kvc {
namespace {

LogSeverity InitialSeverity() {
  const char* env = std::getenv("KVC_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  if (std::strcmp(env, "warning") == 0) return LogSeverity::kWarning;
  if (std::strcmp(env, "error") == 0) return LogSeverity::kError;
  return LogSeverity::kInfo;
}

std::atomic<int>& MinSeverityStorage() {
  static std::atomic<int> severity{static_cast<int>(InitialSeverity())};
  return severity;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  MinSeverityStorage().store(static_cast<int>(severity));
}

LogSeverity MinLogSeverity() { return static_cast<LogSeverity>(MinSeverityStorage().load()); }

namespace internal {

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) : severity_(severity) {
  static constexpr char kLetters[] = {'I', 'W', 'E'};
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm;
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%02d%02d %02d:%02d:%02d.%06lld", tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(micros));
  stream_ << kLetters[static_cast<int>(severity_)] << stamp << ' ' << Basename(file) << ':' << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  // One write() so concurrent lines never interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace internal

namespace internal {

CheckFailure::CheckFailure(const char* file, int line, const char* condition) {
  stream_ << "Check failed at " << Basename(file) << ':' << line << ": " << condition << ' ';
}

CheckFailure::~CheckFailure() {
  stream_ << '\n';
  const std::string line = stream_.str();
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  std::abort();
}

}  // namespace internal
}  // namespace kvc
