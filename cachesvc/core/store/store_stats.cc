#include "cachesvc/core/store/store_stats.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/sequence/snapshot.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

using Eviction = CompressionSpec::Eviction;

int64_t RawBlockBytes(const BlockPool& pool) {
  return static_cast<int64_t>(
      pool.layout(kernels::RawFormatFor(pool.options().geometry.dtype)).block_bytes);
}

}  // namespace

std::vector<PoolSnapshot> StoreStats::ListPools() const {
  std::vector<PoolSnapshot> out;
  for (size_t i = 0; i < parts_.pools.size(); ++i) {
    const BlockPool& pool = *parts_.pools[i];
    PoolSnapshot s;
    s.options = pool.options();
    // Counted in the pool's raw format: what a new uncompressed sequence gets.
    s.block_bytes = RawBlockBytes(pool);
    s.total_blocks = pool.capacity_bytes() / s.block_bytes;
    s.used_bytes = pool.used_bytes();
    s.free_blocks = (pool.capacity_bytes() - s.used_bytes) / s.block_bytes;
    s.sequences = parts_.usage[i]->sequences.load(std::memory_order_relaxed);
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<PoolStatsSnapshot> StoreStats::GetPoolStats(const std::string& pool_name) const {
  const BlockPool* only = nullptr;
  if (!pool_name.empty()) {
    KVC_ASSIGN_OR_RETURN(only, parts_.FindPool(pool_name));
  }
  PoolStatsSnapshot stats;
  stats.pool = pool_name;
  std::vector<FormatBytes> by_format(kernels::kNumStorageFormats);
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    by_format[static_cast<size_t>(f)].format = static_cast<StorageFormat>(f);
  }
  std::array<int64_t, PoolUsage::kEvictionCauses> evicted{};
  for (size_t i = 0; i < parts_.pools.size(); ++i) {
    const BlockPool& pool = *parts_.pools[i];
    if (only != nullptr && &pool != only) continue;
    const PoolUsage& usage = *parts_.usage[i];
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
  stats.appended_bytes_total = parts_.appended_bytes.load(std::memory_order_relaxed);
  stats.fetched_bytes_total = parts_.fetched_bytes.load(std::memory_order_relaxed);
  stats.evicted_token_heads.emplace_back("operator", evicted[0]);
  for (auto why :
       {Eviction::kStreamingLlm, Eviction::kSnapKv, Eviction::kH2o, Eviction::kExpectedAttention}) {
    stats.evicted_token_heads.emplace_back(EvictionName(why), evicted[static_cast<size_t>(why)]);
  }
  KVC_ASSIGN_OR_RETURN(stats.prefix_cache, PrefixCacheStats(pool_name));
  KVC_ASSIGN_OR_RETURN(stats.leases, LeaseStatsFor(pool_name));
  return stats;
}

absl::StatusOr<PoolStatsSnapshot> StoreStats::TenantPoolStats(const std::string& tenant,
                                                              const std::string& pool_name) const {
  const BlockPool* only = nullptr;
  if (!pool_name.empty()) {
    KVC_ASSIGN_OR_RETURN(only, parts_.FindPool(pool_name));
  }
  const std::shared_ptr<TenantAccount> account = parts_.accounts.Find(tenant);
  const TenantQuota quota = QuotaFor(parts_.options.quotas, tenant);
  PoolStatsSnapshot stats;
  stats.pool = pool_name;
  stats.tenant = tenant;
  stats.quota_bytes = quota.max_bytes_per_pool;
  stats.quota_sequences = quota.max_sequences;
  for (size_t i = 0; i < parts_.pools.size(); ++i) {
    if (only != nullptr && parts_.pools[i].get() != only) continue;
    stats.capacity_bytes += parts_.pools[i]->capacity_bytes();
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
      query.pool = parts_.PoolIndex(only);
      stats.sequences = parts_.registry.Count(query);
    }
  }
  return stats;
}

std::vector<TenantUsageSnapshot> StoreStats::TenantUsage() const {
  std::vector<TenantUsageSnapshot> out;
  for (const auto& account : parts_.accounts.All()) {
    TenantUsageSnapshot t;
    t.tenant = account->tenant();
    t.quota = account->quota();
    t.sequences = account->sequences();
    for (size_t i = 0; i < parts_.pools.size(); ++i) {
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

absl::StatusOr<SequenceList> StoreStats::ListSequences(const ListSequencesParams& p) const {
  SequenceOrder::Query query;
  if (!p.pool.empty()) {
    KVC_ASSIGN_OR_RETURN(const BlockPool* only, parts_.FindPool(p.pool));
    query.pool = parts_.PoolIndex(only);
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
  const SequenceOrder::Page page = parts_.registry.List(query);
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

absl::StatusOr<PrefixStats> StoreStats::PrefixCacheStats(const std::string& pool) const {
  PrefixStats sum;
  bool found = pool.empty();
  for (size_t i = 0; i < parts_.pools.size(); ++i) {
    if (!pool.empty() && parts_.pools[i]->options().name != pool) continue;
    found = true;
    const PrefixStats s = parts_.prefixes[i]->stats();
    sum.lookups += s.lookups;
    sum.hits += s.hits;
    sum.lookup_tokens += s.lookup_tokens;
    sum.hit_tokens += s.hit_tokens;
    sum.attached_tokens += s.attached_tokens;
    sum.checksum_misses += s.checksum_misses;
    sum.corrupt_reads += s.corrupt_reads;
    sum.evicted_misses += s.evicted_misses;
    sum.published_entries += s.published_entries;
    sum.evicted_entries += s.evicted_entries;
    sum.entries += s.entries;
    sum.cached_bytes += s.cached_bytes;
    sum.unreferenced_bytes += s.unreferenced_bytes;
  }
  if (!found) return parts_.FindPool(pool).status();
  return sum;
}

absl::StatusOr<LeaseStats> StoreStats::LeaseStatsFor(const std::string& pool) const {
  LeaseStats sum;
  bool found = pool.empty();
  for (size_t i = 0; i < parts_.pools.size(); ++i) {
    if (!pool.empty() && parts_.pools[i]->options().name != pool) continue;
    found = true;
    const LeaseStats s = parts_.leases->Stats(static_cast<int>(i));
    sum.active += s.active;
    sum.leased_bytes += s.leased_bytes;
    sum.granted += s.granted;
    sum.renewed += s.renewed;
    sum.released += s.released;
    sum.expired += s.expired;
    sum.lease_only_bytes += parts_.pools[i]->shares().lease_only_bytes();
  }
  if (!found) return absl::NotFoundError(absl::StrCat("pool ", Quoted(pool), " does not exist"));
  return sum;
}

}  // namespace kvc::cachesvc
