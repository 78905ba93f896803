// Early-return helpers for absl::Status / absl::StatusOr (Abseil 20220623 has none).
// Same meaning as Abseil's later ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVC_STATUS_CONCAT_INNER_(a, b) a##b
#define KVC_STATUS_CONCAT_(a, b) KVC_STATUS_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define KVC_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status kvc_status_ = (expr);       \
    if (!kvc_status_.ok()) return kvc_status_; \
  } while (false)

// `KVC_ASSIGN_OR_RETURN(auto x, Foo());` declares/assigns x from a StatusOr, or returns
// its status.
#define KVC_ASSIGN_OR_RETURN(lhs, expr) \
  KVC_ASSIGN_OR_RETURN_IMPL_(KVC_STATUS_CONCAT_(kvc_statusor_, __LINE__), lhs, expr)

#define KVC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)    \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
