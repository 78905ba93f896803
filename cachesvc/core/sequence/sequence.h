// Sequence: one engine sequence in one pool. Its mutex guards everything mutable; it is held
// for memory work (validation against the state, planning, kernel ops on this sequence's
// blocks), never across network I/O. Kernel work of different sequences runs concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/pool/pool_usage.h"
#include "cachesvc/core/sequence/sequence_storage.h"
#include "cachesvc/core/tenant/tenant_account.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

// The tiers a sequence starts with: its storage format, plus the raw residual tier when the
// policy keeps one.
std::vector<Tier> InitialTiers(const PoolGeometry& geometry, const CompressionSpec& policy);

// Wall-clock milliseconds since the epoch: a new sequence's created_unix_ms.
int64_t NowUnixMs();

class Sequence {
 public:
  // `scope` is the id space the id lives in (tenant_scope.h); `account` the tenant's (charged for
  // the sequence's blocks), in which the pool has index `pool_index`.
  Sequence(std::string id, TenantScope scope, std::string tenant, BlockPool* pool, int pool_index,
           PoolUsage* usage, std::shared_ptr<TenantAccount> account, CompressionSpec policy,
           int64_t created_unix_ms);

  const std::string& id() const { return id_; }
  const TenantScope& scope() const { return scope_; }
  const std::string& tenant() const { return tenant_; }
  BlockPool* pool() const { return pool_; }
  int pool_index() const { return pool_index_; }
  TenantAccount* account() const { return account_.get(); }
  // For what outlives the sequence and charges the same account (a lease).
  const std::shared_ptr<TenantAccount>& shared_account() const { return account_; }
  TenantCharge charge() const {
    return {account_.get(), pool_index_, &pool_->options().name, &scope_.tenant()};
  }
  const PoolGeometry& geometry() const { return pool_->options().geometry; }
  PoolUsage* usage() const { return usage_; }
  const CompressionSpec& policy() const { return policy_; }
  int64_t created_unix_ms() const { return created_unix_ms_; }
  StorageFormat raw_format() const { return kernels::RawFormatFor(geometry().dtype); }

  kvc::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  SequenceStorage& storage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return storage_; }
  const SequenceStorage& storage() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return storage_; }

  // Tokens appended per layer.
  int64_t layer_tokens(int layer) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return layer_tokens_[static_cast<size_t>(layer)];
  }
  const std::vector<int64_t>& all_layer_tokens() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return layer_tokens_;
  }
  void set_layer_tokens(int layer, int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    layer_tokens_[static_cast<size_t>(layer)] = n;
  }
  // Tokens every layer has: what Fetch serves by default.
  int64_t visible_tokens() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return *std::min_element(layer_tokens_.begin(), layer_tokens_.end());
  }
  // True once attention scores exist (an Attend ran or a scoring Compress did): H2O needs them.
  bool has_scores() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return has_scores_; }
  void set_has_scores() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { has_scores_ = true; }
  // Tokens attached from the prefix cache at creation.
  int64_t attached_tokens() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return attached_tokens_; }
  void set_attached_tokens(int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { attached_tokens_ = n; }
  // Set once by Release; every later operation sees NOT_FOUND.
  bool released() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return released_; }
  void set_released() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { released_ = true; }

  // Two-phase appends (append.h): an Append whose rows are written with the lock released
  // marks its layer from planning to commit. While any layer is marked, every other mutation
  // of the sequence waits (AwaitNoWrites, after taking the lock), so nothing it changes or
  // frees is under a write; an Append of a marked layer waits for that layer
  // (AwaitLayerIdle). A mutation waiting for the writes to end keeps new ones from starting
  // (appends of every layer wait behind it), so a stream of appends cannot starve it.
  // Readers never wait: the writes touch only slots no stored token occupies and fresh
  // blocks, which nothing reads before the commit.
  void BeginWrite(int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndWrite(int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AwaitNoWrites() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void AwaitLayerIdle(int layer) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int writes_in_flight() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return writes_in_flight_; }

  // Brings the pool's running totals up to date with this sequence's state (after every
  // mutation; with `gone`, removes the sequence from them).
  void SyncUsage(bool gone = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  const std::string id_;
  const TenantScope scope_;
  const std::string tenant_;
  BlockPool* const pool_;
  const int pool_index_;
  PoolUsage* const usage_;
  const std::shared_ptr<TenantAccount> account_;
  const CompressionSpec policy_;
  const int64_t created_unix_ms_;

  mutable kvc::Mutex mu_;
  SequenceStorage storage_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> layer_tokens_ ABSL_GUARDED_BY(mu_);
  bool has_scores_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int64_t attached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Mutations in AwaitNoWrites (atomic: a Fork waits holding the lock shared).
  mutable std::atomic<int> mutations_waiting_{0};
  std::vector<uint8_t> layer_writing_ ABSL_GUARDED_BY(mu_);  // [layer]: 1 while marked
  // What SyncUsage last added to the pool's totals.
  int64_t counted_visible_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t counted_stored_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::cachesvc
