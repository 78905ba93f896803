// AccessControl: the checks every handler makes before it touches the store — who calls
// (Authenticator), which tenant's id space the call acts in, whether the role allows it, and
// the tenant's call limits. Admin actions are written to the log as audit lines naming the
// caller (tenant and credential kind, never a token).
#pragma once

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/metrics/metrics.h"
#include "cachesvc/security/authenticator.h"
#include "cachesvc/security/call_limits.h"

namespace kvc::cachesvc {

class AccessControl {
 public:
  // `metrics` may be null.
  AccessControl(Authenticator* auth, CallLimits* limits, Metrics* metrics)
      : auth_(auth), limits_(limits), metrics_(metrics) {}

  bool enabled() const { return auth_->enabled(); }
  // The authenticator's generation (Authenticator::generation).
  int64_t generation() const { return auth_->generation(); }
  // UNAUTHENTICATED without a valid credential (authentication on).
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context) const;
  // The id space a call acts in: the caller's tenant, or `requested` (a request's tenant
  // field) for an admin (audited as `what`). PERMISSION_DENIED when a non-admin names
  // another tenant. Without authentication: the one shared id space.
  absl::StatusOr<TenantScope> ScopeFor(const Caller& caller, const std::string& requested,
                                       const char* what) const;
  // PERMISSION_DENIED unless the caller is an admin (or authentication is off); audits the
  // action (`what`, with `detail`) either way.
  absl::Status RequireAdmin(const Caller& caller, const char* what,
                            const std::string& detail) const;
  // A call slot of the caller's tenant (TenantQuota.max_streams / max_compute_calls).
  absl::StatusOr<CallLimits::Slot> Enter(const Caller& caller, CallKind kind) const;
  int InFlight(const std::string& tenant, CallKind kind) const {
    return limits_->InFlight(tenant, kind);
  }

 private:
  Authenticator* auth_;
  CallLimits* limits_;
  Metrics* metrics_;
};

// Keeps an open stream's credential current (AppendStream, AttendStream, Fetch): made before
// the call authenticates, so a reload in between is not missed; StillValid() before each
// message or chunk re-authenticates the call only when the tokens file was reloaded since
// (otherwise one atomic load), and is UNAUTHENTICATED when the credential was revoked or now
// maps to another tenant or role: the stream ends before it applies or sends anything more.
class CredentialCheck {
 public:
  explicit CredentialCheck(const AccessControl* access)
      : access_(access), generation_(access->generation()) {}
  absl::Status StillValid(const grpc::ServerContext& context, const Caller& caller);

 private:
  const AccessControl* access_;
  int64_t generation_;
};

// The caller's own id space: its tenant's, or the shared one without authentication.
TenantScope OwnScope(const Caller& caller);

// "tenant 'a' (token)" for audit lines.
std::string Describe(const Caller& caller);

}  // namespace kvc::cachesvc
