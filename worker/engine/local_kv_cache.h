// In-memory KvCache: dense f32 rows per (layer, kv head), attention computed locally. With no
// policy it is the full cache (the quality ceiling); with a LocalEvictionPolicy it evicts at
// every CommitStep. Not thread-safe; one sequence per cache.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvc/kernels/thread_pool.h"
#include "worker/engine/kv_cache.h"
#include "worker/engine/local_policy.h"

namespace kvc::worker {

class LocalKvCache : public KvCache {
 public:
  // `policy` may be null (full cache). `pool` (optional, not owned) parallelizes attention.
  LocalKvCache(const KvGeometry& geometry, std::unique_ptr<LocalEvictionPolicy> policy,
               kernels::ThreadPool* pool);

  const KvGeometry& geometry() const override { return geometry_; }
  absl::Status Append(int32_t layer, absl::Span<const int32_t> positions,
                      absl::Span<const float> keys, absl::Span<const float> values) override;
  absl::Status Attend(int32_t layer, absl::Span<const float> queries,
                      absl::Span<const int32_t> query_positions, absl::Span<float> out) override;
  absl::StatusOr<LayerKv> Fetch(int32_t layer) override;
  absl::Status CommitStep(int32_t end_position) override;
  int64_t StoredTokenSlots() const override;
  std::string Describe() const override;

  // A copy of everything stored, governed by `policy` from now on (the evaluation prefills
  // once with the full cache and fans the same K/V out to each policy).
  std::unique_ptr<LocalKvCache> Clone(std::unique_ptr<LocalEvictionPolicy> policy) const;

  // Keeps only rows `keep` (ascending indices) of one (layer, kv head): the hook a policy
  // (local or test) uses to give heads different token sets. InvalidArgument on bad indices.
  absl::Status Retain(int32_t layer, int32_t kv_head, absl::Span<const int64_t> keep);

  // Gives the stored tokens of one (layer, kv head) consecutive positions ending at the newest
  // one, re-rotating each key by its shift. FailedPrecondition without geometry().rope_theta.
  absl::Status CloseGaps(int32_t layer, int32_t kv_head);

 private:
  KvGeometry geometry_;
  std::unique_ptr<LocalEvictionPolicy> policy_;
  kernels::ThreadPool* pool_;
  std::vector<LayerKv> layers_;  // [num_layers]
};

}  // namespace kvc::worker
