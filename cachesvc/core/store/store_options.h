// KvStoreOptions: what a KvStore is built from (the server fills it from its config), and the
// seams tests wrap what the store creates with.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cachesvc/core/base/types.h"
#include "cachesvc/core/lease/lease_table.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/tenant/tenant_quota.h"
#include "kvc/kernels/backend.h"

namespace kvc::cachesvc {

// Seams for tests (fault injection): each may wrap what the store creates.
struct StoreHooks {
  std::function<std::unique_ptr<kernels::KernelBackend>(std::unique_ptr<kernels::KernelBackend>)>
      wrap_backend;
  std::function<std::unique_ptr<BlockPool>(std::unique_ptr<BlockPool>)> wrap_pool;
};

struct KvStoreOptions {
  std::vector<PoolOptions> pools;  // at least one; the first is the default
  int64_t max_sequences = 1000000;
  int64_t max_tokens_per_append = int64_t{1} << 20;
  // Largest response one call may build (Attend output and weights); the server sets it
  // from its message limit.
  int64_t max_response_bytes = int64_t{16} << 20;
  // Per-tenant limits; the core enforces max_bytes_per_pool and max_sequences.
  std::vector<TenantQuota> quotas;
  // Cluster identity (ShardIdentity): empty = a single server whose ids stay local.
  std::string shard_name;
  double shard_weight = 1.0;
  // 1 in N Fetch and Attend calls re-checksums the prefix-cache blocks it reads
  // (shared_read_check.h); 1 = every read.
  int64_t verify_shared_reads_every = 64;
  LeaseLimits leases;
  StoreHooks hooks;
};

}  // namespace kvc::cachesvc
