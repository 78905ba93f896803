// KvStore: the cache service core's facade. Owns the kernel backends (CPU, and CUDA per device
// that a pool names), the pools, their usage
// totals and the sequence registry; finds the sequence a request names and hands it to the
// operation that does the work (append.h, fetch.h, compress.h, attend.h) under the
// sequence's lock. Plain C++ with absl::Status results; the RPC layer only converts
// messages. Thread-safe: any number of callers may use it concurrently, and operations on
// different sequences run in parallel (their kernel work too).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/eviction_rule.h"
#include "cachesvc/core/lease_table.h"
#include "cachesvc/core/pool_usage.h"
#include "cachesvc/core/prefix_index.h"
#include "cachesvc/core/requests.h"
#include "cachesvc/core/sequence_registry.h"
#include "cachesvc/core/shard_identity.h"
#include "cachesvc/core/shared_read_check.h"
#include "cachesvc/core/tenant_account.h"
#include "cachesvc/core/tenant_quota.h"
#include "cachesvc/core/types.h"

namespace kvc::cachesvc {

// Seams for tests (fault injection): each may wrap what the store creates.
struct StoreHooks {
  std::function<std::unique_ptr<kernels::KernelBackend>(std::unique_ptr<kernels::KernelBackend>)>
      wrap_backend;
  std::function<std::unique_ptr<BlockPool>(std::unique_ptr<BlockPool>)> wrap_pool;
};

struct KvStoreOptions {
  std::vector<PoolOptions> pools;  // at least one; the first is the default
  int64_t max_sequences = 1000000;
  int64_t max_tokens_per_append = int64_t{1} << 20;
  // Largest response one call may build (Attend output and weights); the server sets it
  // from its message limit.
  int64_t max_response_bytes = int64_t{16} << 20;
  // Per-tenant limits; the core enforces max_bytes_per_pool and max_sequences.
  std::vector<TenantQuota> quotas;
  // Cluster identity (ShardIdentity): empty = a single server whose ids stay local.
  std::string shard_name;
  double shard_weight = 1.0;
  // 1 in N Fetch and Attend calls re-checksums the prefix-cache blocks it reads
  // (shared_read_check.h); 1 = every read.
  int64_t verify_shared_reads_every = 64;
  LeaseLimits leases;
  StoreHooks hooks;
};

class KvStore {
 public:
  // Creates the kernel backend and every pool; INVALID_ARGUMENT for bad options or
  // duplicate pool names.
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const KvStoreOptions& options);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;
  ~KvStore();

  absl::StatusOr<SequenceSnapshot> CreateSequence(const CreateSequenceParams& params);
  // All-or-nothing: on error nothing of the request was stored.
  absl::StatusOr<AppendResult> Append(const AppendParams& params);
  absl::Status Fetch(const FetchParams& params, const FetchSink& sink);
  // Evicts and/or converts the stored tokens per `spec`. All-or-nothing. Freed blocks return
  // to the pool at once.
  absl::StatusOr<CompressResult> Compress(const CompressParams& params);
  // Attention of `n` query tokens of one layer over every token stored for that layer.
  // Accumulates H2O scores.
  absl::StatusOr<AttendResult> Attend(const AttendParams& params);
  // Prefix cache (prefix_index.h). LookupPrefix: how many leading tokens are cached now.
  absl::StatusOr<LookupPrefixResult> LookupPrefix(const LookupPrefixParams& params);
  // Makes the sequence's leading whole blocks, while never evicted, moved or rotated and
  // visible on every layer, reusable by CreateSequence with the same model, salt and format.
  // FAILED_PRECONDITION for a sequence with a raw residual window.
  absl::StatusOr<PublishPrefixResult> PublishPrefix(const PublishPrefixParams& params);
  // A new sequence holding everything the source stores now, its whole blocks shared
  // (copy-on-write) and each partly filled last block copied (sequence_fork.h). Same pool,
  // tenant and policy as the source. All-or-nothing; UNAVAILABLE while draining.
  absl::StatusOr<SequenceSnapshot> ForkSequence(const ForkSequenceParams& params);
  // Cache statistics of one pool (empty = every pool summed); NOT_FOUND for an unknown pool.
  absl::StatusOr<PrefixStats> PrefixCacheStats(const std::string& pool) const;

  // Leases (lease_table.h). LeaseSequence pins every block the sequence's requested layers
  // hold now and describes where each lane's records are; nothing described changes until
  // the lease ends (mutations of the sequence copy a leased block before writing it, and
  // Release leaves leased blocks to the lease). NOT_FOUND, INVALID_ARGUMENT (layers, TTL),
  // RESOURCE_EXHAUSTED (too many leases in this scope).
  absl::StatusOr<LeaseSnapshot> LeaseSequence(const LeaseParams& params);
  // The new expiry (unix ms). NOT_FOUND for an unknown, ended or expired lease.
  absl::StatusOr<int64_t> RenewLease(const std::string& scope, const std::string& lease_id,
                                     int64_t ttl_ms);
  // Ends the lease at once; returns the blocks that went back to the pool. An operator ends
  // another tenant's lease by naming that tenant's scope.
  absl::StatusOr<int64_t> ReleaseLease(const std::string& scope, const std::string& lease_id);
  // The live leases of a scope (unset: every scope) and pool (empty: every pool), oldest
  // first; NOT_FOUND for an unknown pool. Neither this nor any other lookup extends a lease.
  absl::StatusOr<std::vector<LeaseInfo>> ListLeases(const ListLeasesParams& params) const;
  // What a live lease of `scope` pins, for a reader that copies its blocks
  // (cachesvc/transport/lease_sender.h); NOT_FOUND unless the lease is live now.
  absl::StatusOr<LeaseTable::Pinned> PinnedLease(const std::string& scope,
                                                 const std::string& lease_id) const;
  // Whether the lease is live now: live after a copy of its blocks finished means pinned
  // throughout it (an ended lease never comes back).
  bool LeaseLive(const std::string& scope, const std::string& lease_id) const;
  // Lease statistics of one pool (empty = every pool summed); NOT_FOUND for an unknown pool.
  absl::StatusOr<LeaseStats> LeaseStatsFor(const std::string& pool) const;
  // Same-node readers acting for `scope` (cachesvc/transport/local_socket.h; BlockPool::ShareArena
  // and ShareSegment): the shape of one arena of pool `pool` (empty = default), and a
  // read-only descriptor of one of its segments holding that scope's blocks now. NOT_FOUND
  // pool; FAILED_PRECONDITION not shareable, or not the scope's segment (at that epoch).
  absl::StatusOr<SharedArena> ShareArena(const std::string& pool, StorageFormat format,
                                         const std::string& scope);
  absl::StatusOr<UniqueFd> ShareSegment(const std::string& pool, StorageFormat format,
                                        const std::string& scope, int64_t index, uint64_t epoch);
  // `scope`: as in requests.h.
  absl::StatusOr<SequenceSnapshot> GetSequence(const std::string& sequence_id,
                                               const std::string& scope = "") const;
  absl::StatusOr<ReleaseResult> Release(const std::string& sequence_id,
                                        const std::string& scope = "");
  // An operator's eviction: Release, counted as evicted tokens (policy "operator").
  absl::StatusOr<ReleaseResult> Evict(const std::string& sequence_id,
                                      const std::string& scope = "");

  // While draining, CreateSequence answers UNAVAILABLE; everything else keeps working so
  // in-flight work can finish before shutdown.
  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

  // Pool listings and statistics read running totals: they take no sequence lock.
  std::vector<PoolSnapshot> ListPools() const;
  // Empty pool name = every pool summed. NOT_FOUND for an unknown pool.
  absl::StatusOr<PoolStatsSnapshot> GetPoolStats(const std::string& pool) const;
  absl::StatusOr<SequenceList> ListSequences(const ListSequencesParams& params) const;
  // One tenant's use of one pool (empty = every pool summed) and its quota; NOT_FOUND for
  // an unknown pool. A tenant that holds nothing gets zeros.
  absl::StatusOr<PoolStatsSnapshot> TenantPoolStats(const std::string& tenant,
                                                    const std::string& pool) const;
  // Every tenant that holds a sequence, with what it holds; reads atomics only.
  std::vector<TenantUsageSnapshot> TenantUsage() const;
  const std::vector<TenantQuota>& quotas() const { return options_.quotas; }
  // This server's cluster name, incarnation and placement weight.
  const ShardIdentity& shard() const { return shard_; }

  // The pool named `name` (empty = default), or NOT_FOUND listing the pools.
  absl::StatusOr<BlockPool*> FindPool(const std::string& name) const;

 private:
  explicit KvStore(const KvStoreOptions& options)
      : options_(options),
        accounts_(options.quotas, static_cast<int>(options.pools.size())),
        read_sampler_(options.verify_shared_reads_every) {}
  absl::StatusOr<std::shared_ptr<Sequence>> FindLive(const std::string& scope,
                                                     const std::string& id) const;
  absl::StatusOr<ReleaseResult> ReleaseInternal(const std::string& scope, const std::string& id,
                                                bool evicted);
  // Counts an applied append's bytes; returns its result.
  AppendResult Appended(const AppendParams& params, AppendResult result);
  std::string NewSequenceId();
  // INVALID_ARGUMENT for a malformed client_sequence_id, or one naming another shard.
  absl::Status CheckClientId(const std::string& client_sequence_id) const;
  // The id a new sequence gets: the caller's (qualified by this shard) or a fresh one.
  std::string SequenceIdFor(const std::string& client_sequence_id);
  // Makes a fully built new sequence visible (registry, pool count) and returns its
  // snapshot; on refusal (id taken, too many sequences) lets go of its blocks and its slot.
  absl::StatusOr<SequenceSnapshot> Register(const std::shared_ptr<Sequence>& sequence);
  // Shares the longest cached prefix of `prefix` into the new, unpublished sequence `seq`.
  absl::Status AttachPrefix(Sequence& seq, int pool_index, const PrefixSpec& prefix);
  int PoolIndex(const BlockPool* pool) const;
  // The CUDA backend of device `ordinal`, created on first use by pool `pool`;
  // FAILED_PRECONDITION saying why when this build or machine has no such device.
  absl::StatusOr<kernels::KernelBackend*> DeviceBackend(int ordinal, const std::string& pool);

  const KvStoreOptions options_;
  std::unique_ptr<kernels::KernelBackend> backend_;  // the CPU backend: host pools, metadata
  std::vector<std::pair<int, std::unique_ptr<kernels::KernelBackend>>> device_backends_;
  std::vector<std::unique_ptr<BlockPool>> pools_;
  std::vector<std::unique_ptr<PoolUsage>> usage_;  // [pool]
  // After pools_: destroyed first, it hands its blocks back to them.
  std::vector<std::unique_ptr<PrefixIndex>> prefixes_;  // [pool]
  // After pools_ too: ending its leases drops their holders in the pools.
  std::unique_ptr<LeaseTable> leases_;
  SequenceRegistry registry_;
  TenantAccounts accounts_;
  std::atomic<int64_t> appended_bytes_{0};
  std::atomic<int64_t> fetched_bytes_{0};
  ReadSampler read_sampler_;
  std::atomic<bool> draining_{false};
  ShardIdentity shard_;
};

}  // namespace kvc::cachesvc
