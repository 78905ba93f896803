// Early returns of RPC handlers, which end through an RpcScope named `scope` (so every
// refused call is still counted and timed).
#pragma once

#include "common/status_macros.h"
#include "proto/rpc_status.h"

// `caller`: the authenticated Caller of the handler's `context`; UNAUTHENTICATED otherwise.
#define KVC_AUTHENTICATE_OR_FINISH(caller)                                        \
  auto caller##_or = access_->Authenticate(*context);                             \
  if (!caller##_or.ok()) return scope.Finish(ToGrpcStatus(caller##_or.status())); \
  const Caller& caller = *caller##_or

#define KVC_ASSIGN_OR_FINISH(lhs, expr) \
  KVC_ASSIGN_OR_FINISH_IMPL_(KVC_STATUS_CONCAT_(kvc_finish_, __LINE__), lhs, expr)

#define KVC_ASSIGN_OR_FINISH_IMPL_(tmp, lhs, expr)                \
  auto tmp = (expr);                                              \
  if (!tmp.ok()) return scope.Finish(ToGrpcStatus(tmp.status())); \
  lhs = *std::move(tmp)

#define KVC_FINISH_IF_ERROR(expr)                                                        \
  do {                                                                                   \
    const absl::Status kvc_finish_status_ = (expr);                                      \
    if (!kvc_finish_status_.ok()) return scope.Finish(ToGrpcStatus(kvc_finish_status_)); \
  } while (false)
