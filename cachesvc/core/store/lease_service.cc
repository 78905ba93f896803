// LeaseService (lease_service.h): LeaseSequence pins and describes what a sequence stores now;
// the rest act on the lease table or hand a pool's memory to a lease's reader.
#include "cachesvc/core/store/lease_service.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// The leased layers in order: all of them, or the requested ones, each once and in range.
absl::StatusOr<std::vector<int32_t>> LeasedLayers(const std::vector<int32_t>& requested,
                                                  int num_layers) {
  std::vector<int32_t> layers;
  if (requested.empty()) {
    for (int32_t l = 0; l < num_layers; ++l) layers.push_back(l);
    return layers;
  }
  absl::flat_hash_set<int32_t> seen;
  for (int32_t l : requested) {
    if (l < 0 || l >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers: ", l, " is out of range (the pool has ", num_layers, " layers)"));
    }
    if (!seen.insert(l).second) {
      return absl::InvalidArgumentError(absl::StrCat("layers: ", l, " is named twice"));
    }
    layers.push_back(l);
  }
  return layers;
}

}  // namespace

absl::StatusOr<LeaseSnapshot> LeaseService::LeaseSequence(const LeaseParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_.FindLive(p.scope, p.sequence_id));
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, parts_.leases->CheckNew(p.scope, p.ttl_ms));
  const PoolGeometry& g = seq->geometry();
  KVC_ASSIGN_OR_RETURN(const std::vector<int32_t> layers, LeasedLayers(p.layers, g.num_layers));
  BlockPool* pool = seq->pool();

  LeaseSnapshot lease;
  lease.sequence_id = seq->id();
  lease.pool = pool->options().name;
  lease.device = pool->options().device;
  lease.ttl_ms = ttl;
  lease.block_tokens = g.block_tokens;
  lease.head_dim = g.head_dim;
  lease.dtype = g.dtype;
  lease.layers = layers;
  LeaseTable::PerFormat held;
  LeaseTable::PerFormat slots;  // leading token slots described, per held block
  // A reader lock is enough: the holders added below are the only change, and every writer
  // of this sequence, which would consult them, is excluded meanwhile.
  const Sequence& sequence = *seq;  // read only: the const accessors
  kvc::ReaderMutexLock lock(&sequence.mu());
  if (sequence.released()) {
    return absl::NotFoundError(absl::StrCat("sequence ", Quoted(p.sequence_id), " was released"));
  }
  const SequenceStorage& st = sequence.storage();
  lease.visible_tokens = sequence.visible_tokens();
  for (int32_t layer : layers) {
    lease.layer_generations.push_back(st.generation(layer));
    lease.layer_tokens.push_back(sequence.layer_tokens(layer));
    for (int h = 0; h < g.num_kv_heads; ++h) {
      LeasedLane lane{layer, h, {}};
      for (const Segment& s : st.lane(layer, h)) {
        lane.segments.push_back(LeasedSegment{s.format, s.blocks, s.positions});
        auto& list = held[static_cast<size_t>(s.format)];
        list.insert(list.end(), s.blocks.begin(), s.blocks.end());
        // A lane's tokens fill its blocks from the front (segment.h).
        int64_t left = static_cast<int64_t>(s.positions.size());
        for (size_t b = 0; b < s.blocks.size(); ++b, left -= g.block_tokens) {
          slots[static_cast<size_t>(s.format)].push_back(
              static_cast<int32_t>(std::clamp<int64_t>(left, 0, g.block_tokens)));
        }
      }
      lease.lanes.push_back(std::move(lane));
    }
  }
  for (size_t f = 0; f < kernels::kNumStorageFormats; ++f) {
    if (held[f].empty()) continue;
    const auto format = static_cast<StorageFormat>(f);
    lease.layouts.push_back(pool->layout(format));
    lease.segments.push_back(pool->SegmentsOf(format, held[f]));
    lease.leased_bytes += static_cast<int64_t>(held[f].size()) *
                          static_cast<int64_t>(pool->layout(format).block_bytes);
    // The sequence pays for these blocks now; once it lets go of one, the lease does.
    pool->shares().Pin(format, held[f],
                       LeaseTable::ChargeFor(seq->account(), pool, seq->pool_index(), format));
  }
  parts_.leases->Add(LeaseTable::Lessee{p.scope, seq->id(), seq->shared_account()}, pool,
                     seq->pool_index(), std::move(held), std::move(slots), &lease);
  return lease;
}

absl::StatusOr<int64_t> LeaseService::RenewLease(const TenantScope& scope,
                                                 const std::string& lease_id, int64_t ttl_ms) {
  return parts_.leases->Renew(scope, lease_id, ttl_ms);
}

absl::StatusOr<int64_t> LeaseService::ReleaseLease(const TenantScope& scope,
                                                   const std::string& lease_id) {
  return parts_.leases->Release(scope, lease_id);
}

absl::StatusOr<std::vector<LeaseInfo>> LeaseService::ListLeases(const ListLeasesParams& p) const {
  int pool_index = -1;
  if (!p.pool.empty()) {
    KVC_ASSIGN_OR_RETURN(const BlockPool* pool, parts_.FindPool(p.pool));
    pool_index = parts_.PoolIndex(pool);
  }
  std::vector<LeaseInfo> leases = parts_.leases->List(p.scope, pool_index);
  if (!p.tenant.empty()) {
    leases.erase(std::remove_if(leases.begin(), leases.end(),
                                [&](const LeaseInfo& l) { return l.tenant != p.tenant; }),
                 leases.end());
  }
  return leases;
}

absl::StatusOr<LeaseTable::Pinned> LeaseService::PinnedLease(const TenantScope& scope,
                                                             const std::string& lease_id) const {
  return parts_.leases->Find(scope, lease_id);
}

bool LeaseService::LeaseLive(const TenantScope& scope, const std::string& lease_id) const {
  return parts_.leases->Live(scope, lease_id);
}

absl::StatusOr<SharedArena> LeaseService::ShareArena(const std::string& pool, StorageFormat format,
                                                     const TenantScope& scope) {
  KVC_ASSIGN_OR_RETURN(BlockPool * p, parts_.FindPool(pool));
  return p->ShareArena(format, scope.tenant());
}

absl::StatusOr<UniqueFd> LeaseService::ShareSegment(const std::string& pool, StorageFormat format,
                                                    const TenantScope& scope, int64_t index,
                                                    uint64_t epoch) {
  KVC_ASSIGN_OR_RETURN(BlockPool * p, parts_.FindPool(pool));
  return p->ShareSegment(format, scope.tenant(), index, epoch);
}

}  // namespace kvc::cachesvc
