#include "cachesvc/core/sequence/sequence.h"

#include <chrono>

#include "common/check.h"

namespace kvc::cachesvc {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<Tier> InitialTiers(const PoolGeometry& geometry, const CompressionSpec& policy) {
  const StorageFormat raw = kernels::RawFormatFor(geometry.dtype);
  std::vector<Tier> tiers{Tier{policy.storage_set ? policy.storage : raw, Tier::kUnlimited}};
  if (policy.residual_tokens > 0) tiers.push_back(Tier{raw, policy.residual_tokens});
  return tiers;
}

Sequence::Sequence(std::string id, TenantScope scope, std::string tenant, BlockPool* pool,
                   int pool_index, PoolUsage* usage, std::shared_ptr<TenantAccount> account,
                   CompressionSpec policy, int64_t created_unix_ms)
    : id_(std::move(id)),
      scope_(std::move(scope)),
      tenant_(std::move(tenant)),
      pool_(pool),
      pool_index_(pool_index),
      usage_(usage),
      account_(std::move(account)),
      policy_(policy),
      created_unix_ms_(created_unix_ms),
      storage_(pool->options().geometry.num_layers, pool->options().geometry.num_kv_heads,
               kernels::RawFormatFor(pool->options().geometry.dtype),
               InitialTiers(pool->options().geometry, policy)),
      layer_tokens_(static_cast<size_t>(pool->options().geometry.num_layers), 0),
      layer_writing_(static_cast<size_t>(pool->options().geometry.num_layers), 0) {}

void Sequence::BeginWrite(int layer) {
  KVC_CHECK(layer_writing_[static_cast<size_t>(layer)] == 0) << "layer " << layer;
  layer_writing_[static_cast<size_t>(layer)] = 1;
  ++writes_in_flight_;
}

void Sequence::EndWrite(int layer) {
  KVC_CHECK(layer_writing_[static_cast<size_t>(layer)] == 1) << "layer " << layer;
  layer_writing_[static_cast<size_t>(layer)] = 0;
  --writes_in_flight_;
}

void Sequence::AwaitNoWrites() const {
  // The conditions run with the lock held, by whichever thread releases it.
  struct NoWrites {
    const Sequence* seq;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const bool none = seq->writes_in_flight_ == 0;
      seq->mu_.ConditionRead();
      return none;
    }
  };
  const NoWrites cond{this};
  mutations_waiting_.fetch_add(1, std::memory_order_relaxed);
  mu_.Await(absl::Condition(&cond));
  mutations_waiting_.fetch_sub(1, std::memory_order_relaxed);
}

void Sequence::AwaitLayerIdle(int layer) const {
  struct LayerIdle {
    const Sequence* seq;
    size_t layer;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      const bool idle = seq->layer_writing_[layer] == 0 &&
                        seq->mutations_waiting_.load(std::memory_order_relaxed) == 0;
      seq->mu_.ConditionRead();
      return idle;
    }
  };
  const LayerIdle cond{this, static_cast<size_t>(layer)};
  mu_.Await(absl::Condition(&cond));
}

void Sequence::SyncUsage(bool gone) {
  const int64_t visible = gone ? 0 : visible_tokens();
  const int64_t stored = gone ? 0 : storage_.stored_token_heads();
  usage_->visible_tokens.fetch_add(visible - counted_visible_, std::memory_order_relaxed);
  usage_->stored_token_heads.fetch_add(stored - counted_stored_, std::memory_order_relaxed);
  counted_visible_ = visible;
  counted_stored_ = stored;
}

}  // namespace kvc::cachesvc
