#include "cachesvc/core/tenant/tenant_account.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"

namespace kvc::cachesvc {

TenantAccount::TenantAccount(TenantQuota quota, int num_pools)
    : quota_(std::move(quota)),
      bytes_(static_cast<size_t>(num_pools)),
      lease_only_(static_cast<size_t>(num_pools)) {}

absl::Status TenantAccount::AddSequence() {
  int64_t now = sequences_.load(std::memory_order_relaxed);
  do {
    if (quota_.max_sequences > 0 && now >= quota_.max_sequences) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", Quoted(tenant()), " has ", now, " live sequences, its quota (max_sequences ",
          quota_.max_sequences, "); release one first"));
    }
  } while (!sequences_.compare_exchange_weak(now, now + 1, std::memory_order_relaxed));
  return absl::OkStatus();
}

absl::Status TenantAccount::Reserve(int pool, const std::string& pool_name, int64_t bytes) {
  std::atomic<int64_t>& held = bytes_[static_cast<size_t>(pool)];
  int64_t now = held.load(std::memory_order_relaxed);
  do {
    if (quota_.max_bytes_per_pool > 0 && now + bytes > quota_.max_bytes_per_pool) {
      const int64_t leased = lease_only_bytes(pool);
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", Quoted(tenant()), " holds ", now, " bytes in pool ", Quoted(pool_name),
          leased > 0 ? absl::StrCat(" (", leased, " of them pinned only by its leases)") : "",
          "; this call needs ", bytes, " more, over its quota (max_bytes_per_pool ",
          quota_.max_bytes_per_pool, "); release or compress sequences",
          leased > 0 ? " or release leases" : "", " first"));
    }
  } while (!held.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
  return absl::OkStatus();
}

std::shared_ptr<TenantAccount> TenantAccounts::Get(const std::string& tenant) {
  kvc::MutexLock lock(&mu_);
  std::weak_ptr<TenantAccount>& slot = accounts_[tenant];
  if (std::shared_ptr<TenantAccount> live = slot.lock()) return live;
  auto account = std::make_shared<TenantAccount>(QuotaFor(quotas_, tenant), num_pools_);
  slot = account;
  if (accounts_.size() >= sweep_at_) {
    // Forget tenants that hold nothing; amortized O(1) per Get.
    absl::erase_if(accounts_, [](const auto& entry) { return entry.second.expired(); });
    sweep_at_ = std::max<size_t>(64, 2 * accounts_.size());
  }
  return account;
}

std::shared_ptr<TenantAccount> TenantAccounts::Find(const std::string& tenant) const {
  kvc::MutexLock lock(&mu_);
  auto it = accounts_.find(tenant);
  return it == accounts_.end() ? nullptr : it->second.lock();
}

std::vector<std::shared_ptr<TenantAccount>> TenantAccounts::All() const {
  kvc::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<TenantAccount>> all;
  for (const auto& [tenant, weak] : accounts_) {
    if (auto live = weak.lock()) all.push_back(std::move(live));
  }
  return all;
}

}  // namespace kvc::cachesvc
