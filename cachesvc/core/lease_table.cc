#include "cachesvc/core/lease_table.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/quote.h"
#include "cachesvc/core/sequence.h"
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

absl::StatusOr<int64_t> LeaseTable::CheckNew(const std::string& scope, int64_t ttl_ms) const {
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, CheckTtl(ttl_ms));
  kvc::MutexLock lock(&mu_);
  auto it = per_scope_.find(scope);
  if (it != per_scope_.end() && it->second >= limits_.max_per_scope) {
    return absl::ResourceExhaustedError(absl::StrCat("this client already holds ", it->second,
                                                     " leases (the limit): release leases it no "
                                                     "longer reads"));
  }
  return ttl;
}

void LeaseTable::Add(const std::string& scope, BlockPool* pool, int pool_index, PerFormat held,
                     PerFormat slots, LeaseSnapshot* snapshot) {
  Lease lease;
  lease.scope = scope;
  lease.pool = pool;
  lease.pool_index = pool_index;
  lease.expires_ms = NowUnixMs() + snapshot->ttl_ms;
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
  ++per_scope_[scope];
  leases_.emplace(std::move(id), std::move(lease));
}

absl::StatusOr<int64_t> LeaseTable::Renew(const std::string& scope, const std::string& lease_id,
                                          int64_t ttl_ms) {
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, CheckTtl(ttl_ms));
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  const int64_t now = NowUnixMs();
  // An expired lease the reaper has not reached yet is gone all the same: its reader may
  // already have been told so by a failed read.
  if (it == leases_.end() || it->second.scope != scope || it->second.expires_ms <= now) {
    return UnknownLease(lease_id);
  }
  it->second.expires_ms = now + ttl;
  ++counters_[static_cast<size_t>(it->second.pool_index)].renewed;
  return it->second.expires_ms;
}

absl::StatusOr<LeaseTable::Pinned> LeaseTable::Find(const std::string& scope,
                                                    const std::string& lease_id) const {
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.scope != scope || it->second.expires_ms <= NowUnixMs()) {
    return UnknownLease(lease_id);
  }
  return Pinned{it->second.pool, it->second.held, it->second.slots};
}

bool LeaseTable::Live(const std::string& scope, const std::string& lease_id) const {
  kvc::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  return it != leases_.end() && it->second.scope == scope && it->second.expires_ms > NowUnixMs();
}

absl::StatusOr<int64_t> LeaseTable::Release(const std::string& scope, const std::string& lease_id) {
  Lease lease;
  {
    kvc::MutexLock lock(&mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end() || it->second.scope != scope) return UnknownLease(lease_id);
    lease = std::move(it->second);
    leases_.erase(it);
    Counters& c = counters_[static_cast<size_t>(lease.pool_index)];
    --c.active;
    c.bytes -= lease.bytes;
    ++c.released;
    if (--per_scope_[lease.scope] == 0) per_scope_.erase(lease.scope);
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
      if (--per_scope_[it->second.scope] == 0) per_scope_.erase(it->second.scope);
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
    returned += lease.pool->Drop(static_cast<StorageFormat>(f), lease.held[f]);
  }
  return returned;
}

LeaseStats LeaseTable::Stats(int pool_index) const {
  kvc::MutexLock lock(&mu_);
  const Counters& c = counters_[static_cast<size_t>(pool_index)];
  return LeaseStats{c.active, c.bytes, c.granted, c.renewed, c.released, c.expired};
}

}  // namespace kvc::cachesvc
