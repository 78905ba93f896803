// KvStore: the cache service core's facade: a sequence's life (create, fork, get, release,
// evict) and the operations on it (append, fetch, compress, attend). It finds the sequence a
// request names and hands it to the operation that does the work (append.h, fetch.h,
// compress.h, attend.h) under the sequence's lock. Leases, the prefix cache and the
// statistics are services over the same parts (store_parts.h): leases(), prefixes(), stats().
// Plain C++ with absl::Status results; the RPC layer only converts messages. Thread-safe: any
// number of callers may use it concurrently, and operations on different sequences run in
// parallel (their kernel work too).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/store/lease_service.h"
#include "cachesvc/core/store/prefix_service.h"
#include "cachesvc/core/store/store_options.h"
#include "cachesvc/core/store/store_parts.h"
#include "cachesvc/core/store/store_stats.h"

namespace kvc::cachesvc {

class KvStore {
 public:
  // Creates the kernel backend and every pool; INVALID_ARGUMENT for bad options or
  // duplicate pool names.
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const KvStoreOptions& options);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;
  ~KvStore();

  // UNAVAILABLE while draining. With a prefix, starts from the longest cached prefix of it.
  absl::StatusOr<SequenceSnapshot> CreateSequence(const CreateSequenceParams& params);
  // A new sequence holding everything the source stores now, its whole blocks shared
  // (copy-on-write) and each partly filled last block copied (sequence_fork.h). Same pool,
  // tenant and policy as the source. All-or-nothing; UNAVAILABLE while draining.
  absl::StatusOr<SequenceSnapshot> ForkSequence(const ForkSequenceParams& params);
  // `scope`: as in requests.h.
  absl::StatusOr<SequenceSnapshot> GetSequence(const std::string& sequence_id,
                                               const TenantScope& scope = TenantScope()) const;
  absl::StatusOr<ReleaseResult> Release(const std::string& sequence_id,
                                        const TenantScope& scope = TenantScope());
  // An operator's eviction: Release, counted as evicted tokens (policy "operator").
  absl::StatusOr<ReleaseResult> Evict(const std::string& sequence_id,
                                      const TenantScope& scope = TenantScope());

  // All-or-nothing: on error nothing of the request was stored.
  absl::StatusOr<AppendResult> Append(const AppendParams& params);
  absl::Status Fetch(const FetchParams& params, const FetchSink& sink);
  // Evicts and/or converts the stored tokens per `spec`. All-or-nothing. Freed blocks return
  // to the pool at once.
  absl::StatusOr<CompressResult> Compress(const CompressParams& params);
  // Attention of `n` query tokens of one layer over every token stored for that layer.
  // Accumulates H2O scores.
  absl::StatusOr<AttendResult> Attend(const AttendParams& params);

  // While draining, CreateSequence and ForkSequence answer UNAVAILABLE; everything else
  // keeps working so in-flight work can finish before shutdown (stats().draining()).
  void SetDraining(bool draining) { parts_->draining.store(draining); }

  LeaseService& leases() { return leases_; }
  PrefixService& prefixes() { return prefixes_; }
  const StoreStats& stats() const { return stats_; }

 private:
  explicit KvStore(std::unique_ptr<StoreParts> parts)
      : parts_(std::move(parts)), leases_(*parts_), prefixes_(*parts_), stats_(*parts_) {}
  absl::StatusOr<ReleaseResult> ReleaseInternal(const TenantScope& scope, const std::string& id,
                                                bool evicted);
  // Counts an applied append's bytes; returns its result.
  AppendResult Appended(const AppendParams& params, AppendResult result);
  // INVALID_ARGUMENT for a malformed client_sequence_id, or one naming another shard.
  absl::Status CheckClientId(const std::string& client_sequence_id) const;
  // The id a new sequence gets: the caller's (qualified by this shard) or a fresh one.
  std::string SequenceIdFor(const std::string& client_sequence_id);
  // Makes a fully built new sequence visible (registry, pool count) and returns its
  // snapshot; on refusal (id taken, too many sequences) lets go of its blocks and its slot.
  absl::StatusOr<SequenceSnapshot> Register(const std::shared_ptr<Sequence>& sequence);

  const std::unique_ptr<StoreParts> parts_;
  LeaseService leases_;
  PrefixService prefixes_;
  StoreStats stats_;
};

}  // namespace kvc::cachesvc
