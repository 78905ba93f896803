// StoreParts: what KvStore and the services over it (LeaseService, PrefixService, StoreStats)
// share: the kernel backends, the pools with their usage totals, prefix indexes and lease
// table, the sequence registry, the tenants' accounts, the running byte counters and this
// server's identity. Internal to the core: callers reach it only through those four classes,
// each of which holds a reference to one StoreParts that KvStore owns.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/shard_identity.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/lease/lease_table.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/pool/pool_usage.h"
#include "cachesvc/core/prefix/prefix_index.h"
#include "cachesvc/core/prefix/shared_read_check.h"
#include "cachesvc/core/sequence/sequence_registry.h"
#include "cachesvc/core/store/store_options.h"
#include "cachesvc/core/tenant/tenant_account.h"

namespace kvc::cachesvc {

struct StoreParts {
  // Creates the kernel backend and every pool; INVALID_ARGUMENT for bad options or
  // duplicate pool names.
  static absl::StatusOr<std::unique_ptr<StoreParts>> Create(const KvStoreOptions& options);
  StoreParts(const StoreParts&) = delete;
  StoreParts& operator=(const StoreParts&) = delete;
  // Members go in reverse order: sequences, then pools, then the backends they point to.
  ~StoreParts();

  // The pool named `name` (empty = default), or NOT_FOUND listing the pools.
  absl::StatusOr<BlockPool*> FindPool(const std::string& name) const;
  int PoolIndex(const BlockPool* pool) const;
  // The live sequence `id` of `scope` (requests.h); NOT_FOUND otherwise.
  absl::StatusOr<std::shared_ptr<Sequence>> FindLive(const TenantScope& scope,
                                                     const std::string& id) const;

  const KvStoreOptions options;
  std::unique_ptr<kernels::KernelBackend> backend;  // the CPU backend: host pools, metadata
  std::vector<std::pair<int, std::unique_ptr<kernels::KernelBackend>>> device_backends;
  std::vector<std::unique_ptr<BlockPool>> pools;
  std::vector<std::unique_ptr<PoolUsage>> usage;  // [pool]
  // After pools: destroyed first, it hands its blocks back to them.
  std::vector<std::unique_ptr<PrefixIndex>> prefixes;  // [pool]
  // After pools too: ending its leases drops their holders in the pools.
  std::unique_ptr<LeaseTable> leases;
  SequenceRegistry registry;
  TenantAccounts accounts;
  std::atomic<int64_t> appended_bytes{0};
  std::atomic<int64_t> fetched_bytes{0};
  ReadSampler read_sampler;
  std::atomic<bool> draining{false};
  ShardIdentity shard;

 private:
  explicit StoreParts(const KvStoreOptions& options);
  // The CUDA backend of device `ordinal`, created on first use by pool `pool`;
  // FAILED_PRECONDITION saying why when this build or machine has no such device.
  absl::StatusOr<kernels::KernelBackend*> DeviceBackend(int ordinal, const std::string& pool);
};

}  // namespace kvc::cachesvc
