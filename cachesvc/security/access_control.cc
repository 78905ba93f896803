#include "cachesvc/security/access_control.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "common/logging.h"

namespace kvc::cachesvc {

std::string Describe(const Caller& caller) {
  if (!caller.authenticated) return "an unauthenticated caller";
  return absl::StrCat(caller.role == Role::kAdmin ? "admin" : "tenant", " '", caller.tenant, "' (",
                      caller.credential, ")");
}

absl::StatusOr<Caller> AccessControl::Authenticate(const grpc::ServerContext& context) const {
  auto caller = auth_->Authenticate(context);
  if (!caller.ok() && metrics_ != nullptr) metrics_->RecordAuthFailure();
  return caller;
}

TenantScope OwnScope(const Caller& caller) {
  return caller.authenticated ? TenantScope(caller.tenant) : TenantScope();
}

absl::StatusOr<TenantScope> AccessControl::ScopeFor(const Caller& caller,
                                                    const std::string& requested,
                                                    const char* what) const {
  if (!caller.authenticated || requested.empty() || requested == caller.tenant) {
    return OwnScope(caller);
  }
  if (caller.role != Role::kAdmin) {
    return absl::PermissionDeniedError(
        absl::StrCat("the request names tenant ", Quoted(requested), " but the caller is tenant '",
                     caller.tenant,
                     "'; only an admin may act on another tenant's sequences (leave tenant "
                     "empty for your own)"));
  }
  KVC_LOG(INFO) << "audit: " << Describe(caller) << " " << what << " of tenant "
                << Quoted(requested);
  return TenantScope(requested);
}

absl::Status AccessControl::RequireAdmin(const Caller& caller, const char* what,
                                         const std::string& detail) const {
  if (caller.admin()) {
    KVC_LOG(INFO) << "audit: " << Describe(caller) << " " << what << " " << detail;
    return absl::OkStatus();
  }
  KVC_LOG(WARNING) << "audit: refused " << what << " " << detail << " to " << Describe(caller);
  return absl::PermissionDeniedError(
      absl::StrCat(what, " needs the admin role; the caller is tenant '", caller.tenant, "'"));
}

absl::StatusOr<CallLimits::Slot> AccessControl::Enter(const Caller& caller, CallKind kind) const {
  auto slot = limits_->Acquire(caller.authenticated ? caller.tenant : "", kind);
  if (!slot.ok() && metrics_ != nullptr) {
    metrics_->RecordQuotaRefusal(caller.tenant,
                                 kind == CallKind::kStream ? "streams" : "compute_calls");
  }
  return slot;
}

absl::Status CredentialCheck::StillValid(const grpc::ServerContext& context, const Caller& caller) {
  const int64_t now = access_->generation();
  if (now == generation_) return absl::OkStatus();
  generation_ = now;
  absl::StatusOr<Caller> again = access_->Authenticate(context);
  if (again.ok() && again->authenticated == caller.authenticated &&
      again->tenant == caller.tenant && again->role == caller.role) {
    return absl::OkStatus();
  }
  KVC_LOG(WARNING) << "audit: ended a stream of " << Describe(caller)
                   << ": its credential was revoked";
  return absl::UnauthenticatedError(
      "the credential was revoked (or now maps to another tenant or role) while this stream was "
      "open; reconnect with a valid one");
}

}  // namespace kvc::cachesvc
