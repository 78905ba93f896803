// TenantAccount: what one tenant holds (live sequences, block bytes per pool) and its quota.
// The bytes of a pool are those of the blocks its sequences hold plus those of its lease-only
// blocks: blocks that its leases pin and no sequence holds any more (block_shares.h). Sequences
// hold their tenant's account; transactions reserve bytes in it before they allocate (so a call
// over quota is refused having changed nothing) and settle at commit, Release gives the
// sequence's bytes back, and BlockShares moves a leased block's bytes to the lessee when its
// last sequence lets go and off when its last lease does. So the counts are exactly what the
// tenant's sequences and leases hold. Counters are atomics: checking a quota and reading usage
// take no lock.
//
// TenantAccounts: tenant -> account, made on first use. An account lives while a sequence or
// a lease holds it; a tenant with nothing left has no account (its usage is zero), so
// free-text tenant labels of unauthenticated deployments cannot grow the map without bound.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cachesvc/core/tenant/tenant_quota.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class TenantAccount {
 public:
  TenantAccount(TenantQuota quota, int num_pools);
  TenantAccount(const TenantAccount&) = delete;
  TenantAccount& operator=(const TenantAccount&) = delete;
  ~TenantAccount() = default;

  const std::string& tenant() const { return quota_.tenant; }
  const TenantQuota& quota() const { return quota_; }

  // One more live sequence; RESOURCE_EXHAUSTED (naming the limit) at max_sequences.
  absl::Status AddSequence();
  void RemoveSequence() { sequences_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t sequences() const { return sequences_.load(std::memory_order_relaxed); }

  // `bytes` (> 0) more in pool `pool`, or RESOURCE_EXHAUSTED (naming the limit and the
  // current use) when that would pass max_bytes_per_pool; nothing is reserved then.
  absl::Status Reserve(int pool, const std::string& pool_name, int64_t bytes);
  // Unconditional change (a release, a shrinking commit, an unused reservation).
  void Add(int pool, int64_t delta) {
    bytes_[static_cast<size_t>(pool)].fetch_add(delta, std::memory_order_relaxed);
  }
  int64_t bytes(int pool) const {
    return bytes_[static_cast<size_t>(pool)].load(std::memory_order_relaxed);
  }
  // Lease-only bytes in and out of the account (BlockShares, as blocks change hands): they
  // count in bytes() too.
  void AddLeaseOnly(int pool, int64_t delta) {
    lease_only_[static_cast<size_t>(pool)].fetch_add(delta, std::memory_order_relaxed);
    Add(pool, delta);
  }
  // Of bytes(pool): those of lease-only blocks.
  int64_t lease_only_bytes(int pool) const {
    return lease_only_[static_cast<size_t>(pool)].load(std::memory_order_relaxed);
  }

 private:
  const TenantQuota quota_;
  std::atomic<int64_t> sequences_{0};
  std::vector<std::atomic<int64_t>> bytes_;       // [pool]
  std::vector<std::atomic<int64_t>> lease_only_;  // [pool]
};

class TenantAccounts {
 public:
  TenantAccounts(std::vector<TenantQuota> quotas, int num_pools)
      : quotas_(std::move(quotas)), num_pools_(num_pools) {}

  // The tenant's account, made with its quota (QuotaFor) if it has none.
  std::shared_ptr<TenantAccount> Get(const std::string& tenant);
  // The tenant's account if one is live, else null (the tenant holds nothing).
  std::shared_ptr<TenantAccount> Find(const std::string& tenant) const;
  // Every live account.
  std::vector<std::shared_ptr<TenantAccount>> All() const;
  const std::vector<TenantQuota>& quotas() const { return quotas_; }

 private:
  const std::vector<TenantQuota> quotas_;
  const int num_pools_;
  mutable kvc::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<TenantAccount>> accounts_ ABSL_GUARDED_BY(mu_);
  size_t sweep_at_ ABSL_GUARDED_BY(mu_) = 64;
};

// What a transaction charges: the sequence's account and its pool's index there.
struct TenantCharge {
  TenantAccount* account = nullptr;
  int pool = 0;
  const std::string* pool_name = nullptr;
  // The sequence's scope: whose blocks the transaction allocates (BlockPool::AllocateFor);
  // null = "".
  const std::string* owner = nullptr;
};

}  // namespace kvc::cachesvc
