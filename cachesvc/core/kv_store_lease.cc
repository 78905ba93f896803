// KvStore's leases (lease_table.h): LeaseSequence pins and describes what a sequence stores
// now; RenewLease and ReleaseLease act on the table.
#include <array>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/quote.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

constexpr size_t kFormats = kernels::kNumStorageFormats;

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

absl::StatusOr<LeaseSnapshot> KvStore::LeaseSequence(const LeaseParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.scope, p.sequence_id));
  KVC_ASSIGN_OR_RETURN(const int64_t ttl, leases_->CheckNew(p.scope, p.ttl_ms));
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
  std::array<std::vector<BlockId>, kFormats> held;
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
      }
      lease.lanes.push_back(std::move(lane));
    }
  }
  for (size_t f = 0; f < kFormats; ++f) {
    if (held[f].empty()) continue;
    const auto format = static_cast<StorageFormat>(f);
    lease.layouts.push_back(pool->layout(format));
    lease.leased_bytes += static_cast<int64_t>(held[f].size()) *
                          static_cast<int64_t>(pool->layout(format).block_bytes);
    pool->shares().Freeze(format, held[f], 1);
  }
  leases_->Add(p.scope, pool, seq->pool_index(), std::move(held), &lease);
  return lease;
}

absl::StatusOr<int64_t> KvStore::RenewLease(const std::string& scope, const std::string& lease_id,
                                            int64_t ttl_ms) {
  return leases_->Renew(scope, lease_id, ttl_ms);
}

absl::StatusOr<int64_t> KvStore::ReleaseLease(const std::string& scope,
                                              const std::string& lease_id) {
  return leases_->Release(scope, lease_id);
}

absl::StatusOr<SharedArena> KvStore::ShareArena(const std::string& pool, StorageFormat format) {
  KVC_ASSIGN_OR_RETURN(BlockPool * p, FindPool(pool));
  return p->ShareArena(format);
}

absl::StatusOr<LeaseStats> KvStore::LeaseStatsFor(const std::string& pool) const {
  LeaseStats sum;
  bool found = pool.empty();
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (!pool.empty() && pools_[i]->options().name != pool) continue;
    found = true;
    const LeaseStats s = leases_->Stats(static_cast<int>(i));
    sum.active += s.active;
    sum.leased_bytes += s.leased_bytes;
    sum.granted += s.granted;
    sum.renewed += s.renewed;
    sum.released += s.released;
    sum.expired += s.expired;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("pool ", Quoted(pool), " does not exist"));
  return sum;
}

}  // namespace kvc::cachesvc
