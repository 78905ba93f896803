#include "cachesvc/core/lease/lease_table.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/sequence/sequence.h"
#include "common/random_id.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// How often the reaper looks for expired leases: expiry is late by at most this.
constexpr auto kReapEvery = std::chrono::milliseconds(50);

absl::Status UnknownLease(const std::string& lease_id) {
  return absl::NotFoundError(absl::StrCat("lease ", Quoted(lease_id),
                                          " does not exist (never granted, released, or expired)"));
}

}  // namespace

LeaseTable::LeaseTable(const LeaseLimits& limits, int num_pools)
    : limits_(limits), counters_(static_cast<size_t>(num_pools)) {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

LeaseTable::~LeaseTable() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stop_ = true;
  }
  reaper_cv_.notify_all();
  reaper_.join();
  absl::flat_hash_map<std::string, Lease> all;
  {
    kvc::MutexLock lock(&mu_);
    all.swap(leases_);
  }
  for (auto& [id, lease] : all) Drop(lease);
}

void LeaseTable::ReaperLoop() {
  std::unique_lock<std::mutex> lock(reaper_mu_);
  while (!reaper_cv_.wait_for(lock, kReapEvery, [this] { return stop_; })) {
    lock.unlock();
    ExpireDue();
    lock.lock();
  }
}

absl::StatusOr<int64_t> LeaseTable::CheckTtl(int64_t ttl_ms) const {
  if (ttl_ms == 0) return std::min(limits_.default_ttl_ms, limits_.max_ttl_ms);
  if (ttl_ms < 0 || ttl_ms > limits_.max_ttl_ms) {
    return absl::InvalidArgumentError(absl::StrCat("ttl_ms ", ttl_ms, " is out of range: use 1 to ",
                                                   limits_.max_ttl_ms,
                                                   " (0 = ", limits_.default_ttl_ms, ")"));
  }
  return ttl_ms;
}

absl::StatusOr<int64_t> LeaseTable::CheckNew(const TenantScope& scope, int64_t ttl_ms) const {
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, CheckTtl(ttl_ms));
  kvc::MutexLock lock(&mu_);
  auto it = per_scope_.find(scope);
  if (it != per_scope_.end() && it->second >= limits_.max_per_scope) {
    return absl::ResourceExhaustedError(absl::StrCat("this client already holds ", it->second,
                                                     " leases (the limit): release leases it no "
                                                     "longer reads"));
  }
  return std::min(ttl, limits_.max_lifetime_ms);
}

LeaseCharge LeaseTable::ChargeFor(TenantAccount* account, BlockPool* pool, int pool_index,
                                  StorageFormat format) {
  return LeaseCharge{account, pool_index, static_cast<int64_t>(pool->layout(format).block_bytes)};
}

void LeaseTable::Add(Lessee lessee, BlockPool* pool, int pool_index, PerFormat held,
                     PerFormat slots, LeaseSnapshot* snapshot) {
  Lease lease;
  lease.lessee = std::move(lessee);
  lease.pool = pool;
  lease.pool_index = pool_index;
  lease.granted_ms = NowUnixMs();
  lease.expires_ms = lease.granted_ms + snapshot->ttl_ms;
  lease.bytes = snapshot->leased_bytes;
  lease.held = std::move(held);
  lease.slots = std::move(slots);
  snapshot->expires_unix_ms = lease.expires_ms;
  kvc::MutexLock lock(&mu_);
  std::string id = RandomId("l-");
  snapshot->lease_id = id;
  Counters& c = counters_[static_cast<size_t>(pool_index)];
  ++c.active;
  ++c.granted;
  c.bytes += lease.bytes;
  ++per_scope_[lease.lessee.scope];
  leases_.emplace(std::move(id), std::move(lease));
}

absl::StatusOr<int64_t> LeaseTable::Renew(const TenantScope& scope, const std::string& lease_id,
                                          int64_t ttl_ms) {
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, CheckTtl(ttl_ms));
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  const int64_t now = NowUnixMs();
  // An expired lease the reaper has not reached yet is gone all the same: its reader may
  // already have been told so by a failed read.
  if (it == leases_.end() || it->second.lessee.scope != scope || it->second.expires_ms <= now) {
    return UnknownLease(lease_id);
  }
  Lease& lease = it->second;
  // Renewals keep a live reader's snapshot, not the memory forever: past the lifetime, the
  // reader leases again and gets (and is charged for) what the sequence holds then.
  const int64_t last = lease.granted_ms + limits_.max_lifetime_ms;
  if (lease.expires_ms >= last) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease ", Quoted(lease_id), " already expires at its lifetime limit (",
                     limits_.max_lifetime_ms,
                     " ms after it was granted) and cannot be renewed; lease the sequence "
                     "again"));
  }
  lease.expires_ms = std::min(now + ttl, last);
  ++lease.renewals;
  ++counters_[static_cast<size_t>(lease.pool_index)].renewed;
  return lease.expires_ms;
}

absl::StatusOr<LeaseTable::Pinned> LeaseTable::Find(const TenantScope& scope,
                                                    const std::string& lease_id) const {
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.lessee.scope != scope ||
      it->second.expires_ms <= NowUnixMs()) {
    return UnknownLease(lease_id);
  }
  return Pinned{it->second.pool, it->second.held, it->second.slots};
}

bool LeaseTable::Live(const TenantScope& scope, const std::string& lease_id) const {
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  return it != leases_.end() && it->second.lessee.scope == scope &&
         it->second.expires_ms > NowUnixMs();
}

absl::StatusOr<int64_t> LeaseTable::Release(const TenantScope& scope, const std::string& lease_id) {
  Lease lease;
  {
    kvc::MutexLock lock(&mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.lessee.scope != scope) return UnknownLease(lease_id);
    lease = std::move(it->second);
    leases_.erase(it);
    Counters& c = counters_[static_cast<size_t>(lease.pool_index)];
    --c.active;
    c.bytes -= lease.bytes;
    ++c.released;
    if (--per_scope_[lease.lessee.scope] == 0) per_scope_.erase(lease.lessee.scope);
  }
  return Drop(lease);
}

int64_t LeaseTable::ExpireDue() {
  std::vector<Lease> due;
  {
    kvc::MutexLock lock(&mu_);
    const int64_t now = NowUnixMs();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.expires_ms > now) {
        ++it;
        continue;
      }
      Counters& c = counters_[static_cast<size_t>(it->second.pool_index)];
      --c.active;
      c.bytes -= it->second.bytes;
      ++c.expired;
      const TenantScope& scope = it->second.lessee.scope;
      if (--per_scope_[scope] == 0) per_scope_.erase(scope);
      due.push_back(std::move(it->second));
      leases_.erase(it++);
    }
  }
  for (Lease& lease : due) Drop(lease);
  return static_cast<int64_t>(due.size());
}

int64_t LeaseTable::Drop(Lease& lease) {
  int64_t returned = 0;
  for (size_t f = 0; f < lease.held.size(); ++f) {
    if (lease.held[f].empty()) continue;
    const auto format = static_cast<StorageFormat>(f);
    // The account is still held here: the lease's blocks leave it before the lease goes.
    returned += lease.pool->Unpin(
        format, lease.held[f],
        ChargeFor(lease.lessee.account.get(), lease.pool, lease.pool_index, format));
  }
  return returned;
}

LeaseStats LeaseTable::Stats(int pool_index) const {
  kvc::MutexLock lock(&mu_);
  const Counters& c = counters_[static_cast<size_t>(pool_index)];
  return LeaseStats{c.active, c.bytes, c.granted, c.renewed, c.released, c.expired};
}

std::vector<LeaseInfo> LeaseTable::List(const std::optional<TenantScope>& scope,
                                        int pool_index) const {
  struct Found {
    LeaseInfo info;
    BlockPool* pool;
    PerFormat held;
  };
  std::vector<Found> found;
  {
    kvc::MutexLock lock(&mu_);
    const int64_t now = NowUnixMs();
    for (const auto& [id, lease] : leases_) {
      if (scope.has_value() && lease.lessee.scope != *scope) continue;
      if (pool_index >= 0 && lease.pool_index != pool_index) continue;
      if (lease.expires_ms <= now) continue;  // gone, as for Find
      LeaseInfo info;
      info.lease_id = id;
      info.scope = lease.lessee.scope;
      info.tenant = lease.lessee.account != nullptr ? lease.lessee.account->tenant() : "";
      info.sequence_id = lease.lessee.sequence_id;
      info.pool = lease.pool->options().name;
      info.leased_bytes = lease.bytes;
      info.granted_unix_ms = lease.granted_ms;
      info.expires_unix_ms = lease.expires_ms;
      info.renewals = lease.renewals;
      found.push_back(Found{std::move(info), lease.pool, lease.held});
    }
  }
  // Outside mu_: the shares' lock is the pool's business.
  std::vector<LeaseInfo> out;
  out.reserve(found.size());
  for (Found& f : found) {
    for (size_t format = 0; format < f.held.size(); ++format) {
      if (f.held[format].empty()) continue;
      f.info.lease_only_bytes +=
          f.pool->shares().LeaseOnlyBytes(static_cast<StorageFormat>(format), f.held[format]);
    }
    out.push_back(std::move(f.info));
  }
  std::sort(out.begin(), out.end(), [](const LeaseInfo& a, const LeaseInfo& b) {
    return std::tie(a.granted_unix_ms, a.lease_id) < std::tie(b.granted_unix_ms, b.lease_id);
  });
  return out;
}

}  // namespace kvc::cachesvc
