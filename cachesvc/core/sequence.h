// Sequence: one engine sequence's state in one pool. Its mutex guards everything mutable;
// it is held only for memory work (validation, block allocation, copies), never across
// network I/O.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/block_table.h"
#include "cachesvc/core/types.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class Sequence {
 public:
  Sequence(std::string id, std::string tenant, BlockPool* pool, CompressionSpec policy,
           int64_t created_unix_ms)
      : id_(std::move(id)),
        tenant_(std::move(tenant)),
        pool_(pool),
        policy_(policy),
        created_unix_ms_(created_unix_ms),
        table_(pool->options().geometry.num_layers, pool->options().geometry.num_kv_heads,
               pool->options().geometry.block_tokens),
        residual_(pool->options().geometry.num_layers, pool->options().geometry.num_kv_heads,
                  pool->options().geometry.block_tokens),
        layer_tokens_(static_cast<size_t>(pool->options().geometry.num_layers), 0),
        format_(policy.storage_set ? policy.storage
                                   : kernels::RawFormatFor(pool->options().geometry.dtype)),
        residual_limit_(policy.residual_tokens) {}

  const std::string& id() const { return id_; }
  const std::string& tenant() const { return tenant_; }
  BlockPool* pool() const { return pool_; }
  const CompressionSpec& policy() const { return policy_; }
  int64_t created_unix_ms() const { return created_unix_ms_; }

  kvc::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  BlockTable& table() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return table_; }
  const BlockTable& table() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return table_; }
  // The raw recent residual: with residual_limit() > 0 the newest tokens of every lane live
  // here in the pool's raw format (raw_format()), and move into table() in format() as they
  // age out. Every residual token is newer than every token of table() in the same lane.
  BlockTable& residual() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return residual_; }
  const BlockTable& residual() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return residual_; }
  int64_t residual_limit() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return residual_limit_; }
  void set_residual_limit(int64_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    residual_limit_ = limit;
  }
  StorageFormat raw_format() const {
    return kernels::RawFormatFor(pool_->options().geometry.dtype);
  }
  // Residual tokens of a layer (every kv head of a layer holds the same number).
  int64_t residual_tokens(int layer) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return residual_.head(layer, 0).tokens;
  }
  // Stored tokens of one lane, low-bit part and residual together.
  int64_t stored_tokens(int layer, int kv_head) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return table_.head(layer, kv_head).tokens + residual_.head(layer, kv_head).tokens;
  }
  std::vector<int64_t>& layer_tokens() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return layer_tokens_; }
  const std::vector<int64_t>& layer_tokens() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return layer_tokens_;
  }
  // Tokens every layer has: what Fetch may serve.
  int64_t visible_tokens() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return *std::min_element(layer_tokens_.begin(), layer_tokens_.end());
  }
  // Format every stored token of this sequence is in (a Compress may change it).
  StorageFormat format() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return format_; }
  void set_format(StorageFormat format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { format_ = format; }
  // True once attention scores exist (an Attend ran or a scoring Compress did): H2O needs them.
  bool has_scores() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return has_scores_; }
  void set_has_scores() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { has_scores_ = true; }
  // Set once by Release; every later operation sees NOT_FOUND.
  bool released() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return released_; }
  void set_released() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { released_ = true; }
  // Bumped whenever stored tokens move or disappear (release, compression), so a streaming
  // Fetch can detect that what it started to read changed under it.
  uint64_t generation() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generation_; }
  void bump_generation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++generation_; }

 private:
  const std::string id_;
  const std::string tenant_;
  BlockPool* const pool_;
  const CompressionSpec policy_;
  const int64_t created_unix_ms_;

  mutable kvc::Mutex mu_;
  BlockTable table_ ABSL_GUARDED_BY(mu_);
  BlockTable residual_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> layer_tokens_ ABSL_GUARDED_BY(mu_);  // tokens appended per layer
  StorageFormat format_ ABSL_GUARDED_BY(mu_);
  int64_t residual_limit_ ABSL_GUARDED_BY(mu_);
  bool has_scores_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::cachesvc
