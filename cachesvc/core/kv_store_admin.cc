// KvStore's listings and statistics. Pool figures come from the pools' atomic counters and
// the running totals the sequences keep (PoolUsage): no sequence lock is taken, so a metrics
// scrape costs the same with 100 or 10,000 live sequences. ListSequences visits only the
// sequences of its page (the registry keeps them in creation order: sequence_order.h).
#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/snapshot.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

using Eviction = CompressionSpec::Eviction;

int64_t RawBlockBytes(const BlockPool& pool) {
  return static_cast<int64_t>(
      pool.layout(kernels::RawFormatFor(pool.options().geometry.dtype)).block_bytes);
}

}  // namespace

std::vector<PoolSnapshot> KvStore::ListPools() const {
  std::vector<PoolSnapshot> out;
  for (size_t i = 0; i < pools_.size(); ++i) {
    const BlockPool& pool = *pools_[i];
    PoolSnapshot s;
    s.options = pool.options();
    // Counted in the pool's raw format: what a new uncompressed sequence gets.
    s.block_bytes = RawBlockBytes(pool);
    s.total_blocks = pool.capacity_bytes() / s.block_bytes;
    s.used_bytes = pool.used_bytes();
    s.free_blocks = (pool.capacity_bytes() - s.used_bytes) / s.block_bytes;
    s.sequences = usage_[i]->sequences.load(std::memory_order_relaxed);
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<PoolStatsSnapshot> KvStore::GetPoolStats(const std::string& pool_name) const {
  const BlockPool* only = nullptr;
  if (!pool_name.empty()) {
    KVC_ASSIGN_OR_RETURN(only, FindPool(pool_name));
  }
  PoolStatsSnapshot stats;
  stats.pool = pool_name;
  std::vector<FormatBytes> by_format(kernels::kNumStorageFormats);
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    by_format[static_cast<size_t>(f)].format = static_cast<StorageFormat>(f);
  }
  std::array<int64_t, PoolUsage::kEvictionCauses> evicted{};
  for (size_t i = 0; i < pools_.size(); ++i) {
    const BlockPool& pool = *pools_[i];
    if (only != nullptr && &pool != only) continue;
    const PoolUsage& usage = *usage_[i];
    for (int c = 0; c < PoolUsage::kEvictionCauses; ++c) {
      evicted[static_cast<size_t>(c)] +=
          usage.evicted_token_heads[static_cast<size_t>(c)].load(std::memory_order_relaxed);
    }
    stats.capacity_bytes += pool.capacity_bytes();
    stats.used_bytes += pool.used_bytes();
    stats.free_resident_bytes += pool.free_resident_bytes();
    stats.released_bytes_total += pool.released_bytes_total();
    stats.total_blocks += pool.capacity_bytes() / RawBlockBytes(pool);
    for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
      const auto format = static_cast<StorageFormat>(f);
      const int64_t used = pool.used_blocks(format);
      stats.used_blocks += used;
      FormatBytes& fb = by_format[static_cast<size_t>(f)];
      fb.blocks += used;
      fb.bytes += used * static_cast<int64_t>(pool.layout(format).block_bytes);
    }
    const PoolGeometry& g = pool.options().geometry;
    const int64_t visible = usage.visible_tokens.load(std::memory_order_relaxed);
    stats.sequences += usage.sequences.load(std::memory_order_relaxed);
    stats.visible_tokens += visible;
    stats.stored_token_heads += usage.stored_token_heads.load(std::memory_order_relaxed);
    stats.dense_bytes += 2 * visible * g.num_layers * g.TokenLayerBytes(g.dtype);
  }
  for (const FormatBytes& fb : by_format) {
    if (fb.blocks > 0) stats.bytes_by_format.push_back(fb);
  }
  stats.appended_bytes_total = appended_bytes_.load(std::memory_order_relaxed);
  stats.fetched_bytes_total = fetched_bytes_.load(std::memory_order_relaxed);
  stats.evicted_token_heads.emplace_back("operator", evicted[0]);
  for (auto why :
       {Eviction::kStreamingLlm, Eviction::kSnapKv, Eviction::kH2o, Eviction::kExpectedAttention}) {
    stats.evicted_token_heads.emplace_back(EvictionName(why), evicted[static_cast<size_t>(why)]);
  }
  KVC_ASSIGN_OR_RETURN(stats.prefix_cache, PrefixCacheStats(pool_name));
  KVC_ASSIGN_OR_RETURN(stats.leases, LeaseStatsFor(pool_name));
  return stats;
}

absl::StatusOr<PoolStatsSnapshot> KvStore::TenantPoolStats(const std::string& tenant,
                                                           const std::string& pool_name) const {
  const BlockPool* only = nullptr;
  if (!pool_name.empty()) {
    KVC_ASSIGN_OR_RETURN(only, FindPool(pool_name));
  }
  const std::shared_ptr<TenantAccount> account = accounts_.Find(tenant);
  const TenantQuota quota = QuotaFor(options_.quotas, tenant);
  PoolStatsSnapshot stats;
  stats.pool = pool_name;
  stats.tenant = tenant;
  stats.quota_bytes = quota.max_bytes_per_pool;
  stats.quota_sequences = quota.max_sequences;
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (only != nullptr && pools_[i].get() != only) continue;
    stats.capacity_bytes += pools_[i]->capacity_bytes();
    if (account != nullptr) {
      stats.used_bytes += account->bytes(static_cast<int>(i));
      // The tenant's own lease-only bytes (part of used_bytes); the rest of the pool's lease
      // statistics are other tenants' business.
      stats.leases.lease_only_bytes += account->lease_only_bytes(static_cast<int>(i));
    }
  }
  if (account != nullptr) {
    // Sequences are counted per tenant, not per pool: a pool's share is counted by a visit.
    if (only == nullptr) {
      stats.sequences = account->sequences();
    } else {
      SequenceOrder::Query query;
      query.tenant = &tenant;
      query.pool = PoolIndex(only);
      stats.sequences = registry_.Count(query);
    }
  }
  return stats;
}

std::vector<TenantUsageSnapshot> KvStore::TenantUsage() const {
  std::vector<TenantUsageSnapshot> out;
  for (const auto& account : accounts_.All()) {
    TenantUsageSnapshot t;
    t.tenant = account->tenant();
    t.quota = account->quota();
    t.sequences = account->sequences();
    for (size_t i = 0; i < pools_.size(); ++i) {
      t.pool_bytes.push_back(account->bytes(static_cast<int>(i)));
      t.lease_only_bytes.push_back(account->lease_only_bytes(static_cast<int>(i)));
    }
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const TenantUsageSnapshot& a, const TenantUsageSnapshot& b) {
    return a.tenant < b.tenant;
  });
  return out;
}

absl::StatusOr<SequenceList> KvStore::ListSequences(const ListSequencesParams& p) const {
  SequenceOrder::Query query;
  if (!p.pool.empty()) {
    KVC_ASSIGN_OR_RETURN(const BlockPool* only, FindPool(p.pool));
    query.pool = PoolIndex(only);
  }
  if (p.limit < 0 || p.limit > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit is ", p.limit, "; expected 0..10000 (0 = 1000)"));
  }
  SequenceOrder::Key after;
  if (!p.page_token.empty()) {
    KVC_ASSIGN_OR_RETURN(after, SequenceOrder::ParseToken(p.page_token));
    query.after = &after;
  }
  if (p.scope) query.scope = &*p.scope;
  if (!p.tenant.empty()) query.tenant = &p.tenant;
  query.limit = p.limit == 0 ? 1000 : p.limit;
  const SequenceOrder::Page page = registry_.List(query);
  SequenceList list;
  list.total = page.total;
  for (const auto& seq : page.sequences) {
    kvc::ReaderMutexLock lock(&seq->mu());
    // Released after the page was collected: left out (the next page starts after it anyway).
    if (!seq->released()) list.sequences.push_back(SnapshotLocked(*seq));
  }
  if (page.more) list.next_page_token = SequenceOrder::Token(page.last);
  return list;
}

}  // namespace kvc::cachesvc
