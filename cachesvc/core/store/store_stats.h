// StoreStats: the read-only view of a KvStore that metrics and the admin service read: pool
// listings and statistics (from the pools' atomic counters and the sequences' running totals,
// PoolUsage: no sequence lock is taken, so a scrape costs the same with 100 or 10,000 live
// sequences), sequence listings by page (sequence_order.h), tenants' usage and quotas, the
// prefix cache's and the leases' statistics, and this server's identity. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/store/store_parts.h"
#include "cachesvc/core/tenant/tenant_quota.h"

namespace kvc::cachesvc {

// One tenant's holdings and limits (TenantUsage: every tenant that holds something).
struct TenantUsageSnapshot {
  std::string tenant;
  int64_t sequences = 0;
  std::vector<int64_t> pool_bytes;  // [pool], in the order of ListPools
  TenantQuota quota;
  std::vector<int64_t> lease_only_bytes;  // [pool]: of pool_bytes, blocks only its leases hold
};

class StoreStats {
 public:
  explicit StoreStats(const StoreParts& parts) : parts_(parts) {}

  std::vector<PoolSnapshot> ListPools() const;
  // Empty pool name = every pool summed. NOT_FOUND for an unknown pool.
  absl::StatusOr<PoolStatsSnapshot> GetPoolStats(const std::string& pool) const;
  absl::StatusOr<SequenceList> ListSequences(const ListSequencesParams& params) const;
  // One tenant's use of one pool (empty = every pool summed) and its quota; NOT_FOUND for
  // an unknown pool. A tenant that holds nothing gets zeros.
  absl::StatusOr<PoolStatsSnapshot> TenantPoolStats(const std::string& tenant,
                                                    const std::string& pool) const;
  // Every tenant that holds a sequence, with what it holds; reads atomics only.
  std::vector<TenantUsageSnapshot> TenantUsage() const;
  // Cache statistics of one pool (empty = every pool summed); NOT_FOUND for an unknown pool.
  absl::StatusOr<PrefixStats> PrefixCacheStats(const std::string& pool) const;
  // Lease statistics of one pool (empty = every pool summed); NOT_FOUND for an unknown pool.
  absl::StatusOr<LeaseStats> LeaseStatsFor(const std::string& pool) const;
  const std::vector<TenantQuota>& quotas() const { return parts_.options.quotas; }
  // This server's cluster name, incarnation and placement weight.
  const ShardIdentity& shard() const { return parts_.shard; }
  bool draining() const { return parts_.draining.load(); }

 private:
  const StoreParts& parts_;
};

}  // namespace kvc::cachesvc
