// TenantQuota: the limits one tenant's calls are held to (ServerConfig.quotas). The core
// enforces the memory ones (bytes per pool, live sequences) before it allocates; the RPC
// layer the call ones (open streams, Attend/Compress in flight).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvc::cachesvc {

struct TenantQuota {
  std::string tenant;              // "*" = every tenant without an entry of its own
  int64_t max_bytes_per_pool = 0;  // 0 = unlimited
  int64_t max_sequences = 0;
  int32_t max_streams = 0;
  int32_t max_compute_calls = 0;
};

// The entry for `tenant`: its own, else "*", else unlimited.
inline TenantQuota QuotaFor(const std::vector<TenantQuota>& quotas, const std::string& tenant) {
  const TenantQuota* fallback = nullptr;
  for (const TenantQuota& q : quotas) {
    if (q.tenant == tenant) return q;
    if (q.tenant == "*") fallback = &q;
  }
  TenantQuota result = fallback != nullptr ? *fallback : TenantQuota{};
  result.tenant = tenant;
  return result;
}

}  // namespace kvc::cachesvc
