#include "worker/engine/local_kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/engine/attention.h"
#include "worker/engine/ops.h"

namespace kvc::worker {

LocalKvCache::LocalKvCache(const KvGeometry& geometry, std::unique_ptr<LocalEvictionPolicy> policy,
                           kernels::ThreadPool* pool)
    : geometry_(geometry), policy_(std::move(policy)), pool_(pool) {
  layers_.resize(static_cast<size_t>(geometry_.num_layers));
  for (LayerKv& l : layers_) l.heads.resize(static_cast<size_t>(geometry_.num_kv_heads));
}

absl::Status LocalKvCache::Append(int32_t layer, absl::Span<const int32_t> positions,
                                  absl::Span<const float> keys, absl::Span<const float> values) {
  if (layer < 0 || layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  const size_t n = positions.size();
  const size_t row = static_cast<size_t>(geometry_.num_kv_heads) * geometry_.head_dim;
  if (keys.size() != n * row || values.size() != n * row) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keys/values must be [", n, ", ", geometry_.num_kv_heads, ", ", geometry_.head_dim, "]"));
  }
  LayerKv& l = layers_[layer];
  for (size_t i = 0; i < n; ++i) {
    const bool after_prev = i == 0 ? true : positions[i] > positions[i - 1];
    bool after_stored = true;
    for (const HeadKv& h : l.heads) {
      if (!h.positions.empty() && positions[i] <= h.positions.back()) after_stored = false;
    }
    if (!after_prev || !after_stored || positions[i] < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", layer, ": position ", positions[i], " is not after the last"));
    }
  }
  const size_t hd = static_cast<size_t>(geometry_.head_dim);
  for (int32_t h = 0; h < geometry_.num_kv_heads; ++h) {
    HeadKv& head = l.heads[h];
    for (size_t i = 0; i < n; ++i) {
      head.positions.push_back(positions[i]);
      const size_t off = i * row + static_cast<size_t>(h) * hd;
      head.keys.insert(head.keys.end(), keys.begin() + off, keys.begin() + off + hd);
      head.values.insert(head.values.end(), values.begin() + off, values.begin() + off + hd);
    }
  }
  return absl::OkStatus();
}

absl::Status LocalKvCache::Attend(int32_t layer, absl::Span<const float> queries,
                                  absl::Span<const int32_t> query_positions,
                                  absl::Span<float> out) {
  if (layer < 0 || layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  const size_t expect =
      query_positions.size() * static_cast<size_t>(geometry_.num_q_heads) * geometry_.head_dim;
  if (queries.size() != expect || out.size() != expect || query_positions.empty()) {
    return absl::InvalidArgumentError("queries/out must be [n, num_q_heads, head_dim], n > 0");
  }
  AttendLayer(geometry_, layers_[layer], queries, query_positions, out, pool_);
  return absl::OkStatus();
}

absl::StatusOr<LayerKv> LocalKvCache::Fetch(int32_t layer) {
  if (layer < 0 || layer >= geometry_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  return layers_[layer];
}

std::unique_ptr<LocalKvCache> LocalKvCache::Clone(
    std::unique_ptr<LocalEvictionPolicy> policy) const {
  auto copy = std::make_unique<LocalKvCache>(geometry_, std::move(policy), pool_);
  copy->layers_ = layers_;
  return copy;
}

absl::Status LocalKvCache::Retain(int32_t layer, int32_t kv_head, absl::Span<const int64_t> keep) {
  if (layer < 0 || layer >= geometry_.num_layers || kv_head < 0 ||
      kv_head >= geometry_.num_kv_heads) {
    return absl::InvalidArgumentError("layer or kv head out of range");
  }
  HeadKv& h = layers_[layer].heads[kv_head];
  const int64_t n = static_cast<int64_t>(h.positions.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || keep[i] >= n || (i > 0 && keep[i] <= keep[i - 1])) {
      return absl::InvalidArgumentError("keep indices must be ascending and in range");
    }
  }
  const size_t hd = static_cast<size_t>(geometry_.head_dim);
  // In-place compaction: survivors move down, order (and so position order) is preserved.
  for (size_t i = 0; i < keep.size(); ++i) {
    const size_t src = static_cast<size_t>(keep[i]);
    if (src == i) continue;
    h.positions[i] = h.positions[src];
    std::copy_n(h.keys.begin() + src * hd, hd, h.keys.begin() + i * hd);
    std::copy_n(h.values.begin() + src * hd, hd, h.values.begin() + i * hd);
  }
  h.positions.resize(keep.size());
  h.keys.resize(keep.size() * hd);
  h.values.resize(keep.size() * hd);
  return absl::OkStatus();
}

absl::Status LocalKvCache::CloseGaps(int32_t layer, int32_t kv_head) {
  if (geometry_.rope_theta <= 0.0f) {
    return absl::FailedPreconditionError("re-rotation needs KvGeometry::rope_theta");
  }
  HeadKv& h = layers_[layer].heads[kv_head];
  const int64_t n = static_cast<int64_t>(h.positions.size());
  if (n == 0) return absl::OkStatus();
  const int32_t last = h.positions.back();
  std::vector<int32_t> delta(static_cast<size_t>(n));
  bool moved = false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t target = last - static_cast<int32_t>(n - 1 - i);
    delta[i] = target - h.positions[i];
    moved |= delta[i] != 0;
    h.positions[i] = target;
  }
  // Rotations compose additively, so rotating by the shift moves a key to its new position.
  if (moved) ApplyRope(h.keys.data(), delta, /*heads=*/1, geometry_.head_dim, geometry_.rope_theta);
  return absl::OkStatus();
}

absl::Status LocalKvCache::CommitStep(int32_t /*end_position*/) {
  if (policy_ == nullptr) return absl::OkStatus();
  for (int32_t l = 0; l < geometry_.num_layers; ++l) {
    for (int32_t h = 0; h < geometry_.num_kv_heads; ++h) {
      const std::vector<int32_t>& pos = layers_[l].heads[h].positions;
      const std::vector<int64_t> keep = policy_->SelectKeep(l, h, pos);
      if (keep.size() == pos.size()) continue;
      if (auto s = Retain(l, h, keep); !s.ok()) return s;
      if (policy_->ClosesGaps()) {
        if (auto s = CloseGaps(l, h); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

int64_t LocalKvCache::StoredTokenSlots() const {
  int64_t total = 0;
  for (const LayerKv& l : layers_) {
    for (const HeadKv& h : l.heads) total += static_cast<int64_t>(h.positions.size());
  }
  return total;
}

std::string LocalKvCache::Describe() const {
  return policy_ == nullptr ? "local full" : policy_->Describe();
}

}  // namespace kvc::worker
