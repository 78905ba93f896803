// TenantScope: the id space a call acts in — the caller's authenticated tenant, or the one
// shared space of a server without authentication. Sequence ids, lease ids, transfers and
// staging regions are unique only within a scope, and every lookup of one takes the scope, so
// another tenant's id is NOT_FOUND exactly as an id never created.
//
// A type, not a string, so that a tenant name, a sequence id or a pool name cannot be passed
// where a scope is meant: the RPC layer makes one per call from the authenticated caller
// (AccessControl::ScopeFor, the local socket's handshake), and below it the core and the
// transports only pass it on and compare it. The pools tag blocks with its tenant() name.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

namespace kvc::cachesvc {

class TenantScope {
 public:
  // The shared id space (authentication off).
  TenantScope() = default;
  // The id space of `tenant`; "" is the shared one.
  explicit TenantScope(std::string tenant) : tenant_(std::move(tenant)) {}

  // The tenant's name, "" for the shared space.
  const std::string& tenant() const { return tenant_; }

  bool operator==(const TenantScope& other) const { return tenant_ == other.tenant_; }
  bool operator!=(const TenantScope& other) const { return tenant_ != other.tenant_; }
  template <typename H>
  friend H AbslHashValue(H h, const TenantScope& scope) {
    return H::combine(std::move(h), scope.tenant_);
  }

 private:
  std::string tenant_;
};

// What the type is for: no name turns into a scope by accident.
static_assert(!std::is_convertible_v<std::string, TenantScope> &&
                  !std::is_convertible_v<const char*, TenantScope>,
              "a TenantScope is made explicitly, from an authenticated caller");

}  // namespace kvc::cachesvc
