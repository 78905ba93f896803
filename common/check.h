// KVC_CHECK: aborts with file:line and a message when an internal invariant is broken.
// Not for input validation (that returns absl::Status); for programming errors only.
#pragma once

#include <sstream>

namespace kvc::internal {

// Collects the streamed message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  CheckFailure(const CheckFailure&) = delete;  // a copy would abort twice
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `KVC_CHECK(c) << x` compile as a void expression in the ternary below.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace kvc::internal

#define KVC_CHECK(condition)                 \
  (condition) ? (void)0                      \
              : ::kvc::internal::Voidify() & \
                    ::kvc::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#ifdef NDEBUG
#define KVC_DCHECK(condition) \
  while (false) KVC_CHECK(condition)
#else
#define KVC_DCHECK(condition) KVC_CHECK(condition)
#endif
