// The one error type of kernels/: a code plus a static detail string. Kernels never throw;
// the service maps codes onto absl::Status in one place (kInvalidArgument ->
// INVALID_ARGUMENT, kUnavailable -> UNAVAILABLE, kUnsupported -> UNIMPLEMENTED or
// INVALID_ARGUMENT, kInternal -> INTERNAL, kOutOfMemory -> RESOURCE_EXHAUSTED).
#pragma once

namespace kvc::kernels {

enum class KernelStatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // shapes, dtypes, ids or pointers the caller got wrong
  kUnsupported = 2,      // valid request this backend/format/head_dim cannot do
  kUnavailable = 3,      // backend not built or no device present
  kOutOfMemory = 4,      // allocation failed
  kInternal = 5,         // a device error (launch failure, bad driver state)
};

struct [[nodiscard]] KernelStatus {
  KernelStatusCode code = KernelStatusCode::kOk;
  const char* detail = "";  // static string, never owned; says what to fix

  constexpr bool ok() const { return code == KernelStatusCode::kOk; }
  static constexpr KernelStatus Ok() { return KernelStatus{}; }
  static constexpr KernelStatus Invalid(const char* d) {
    return KernelStatus{KernelStatusCode::kInvalidArgument, d};
  }
  static constexpr KernelStatus Unsupported(const char* d) {
    return KernelStatus{KernelStatusCode::kUnsupported, d};
  }
  static constexpr KernelStatus Unavailable(const char* d) {
    return KernelStatus{KernelStatusCode::kUnavailable, d};
  }
  static constexpr KernelStatus Internal(const char* d) {
    return KernelStatus{KernelStatusCode::kInternal, d};
  }
};

constexpr const char* KernelStatusCodeName(KernelStatusCode code) {
  switch (code) {
    case KernelStatusCode::kOk:
      return "OK";
    case KernelStatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case KernelStatusCode::kUnsupported:
      return "UNSUPPORTED";
    case KernelStatusCode::kUnavailable:
      return "UNAVAILABLE";
    case KernelStatusCode::kOutOfMemory:
      return "OUT_OF_MEMORY";
    case KernelStatusCode::kInternal:
      return "INTERNAL";
  }
  return "?";
}

}  // namespace kvc::kernels

// Returns early from a function returning KernelStatus when `expr` is not ok.
#define KVC_KERNEL_RETURN_IF_ERROR(expr)                \
  do {                                                  \
    const ::kvc::kernels::KernelStatus _kvc_s = (expr); \
    if (!_kvc_s.ok()) return _kvc_s;                    \
  } while (0)
