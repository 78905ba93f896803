// KvStore: the cache service's core. Owns the pools and the sequence registry and
// implements every operation as plain C++ with absl::Status results; the RPC layer only
// converts messages. Thread-safe: any number of callers may use it concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/sequence_registry.h"
#include "cachesvc/core/types.h"

namespace kvc::cachesvc {

struct KvStoreOptions {
  std::vector<PoolOptions> pools;  // at least one; the first is the default
  int64_t max_sequences = 1000000;
  int64_t max_tokens_per_append = int64_t{1} << 20;
};

struct CreateSequenceParams {
  std::string pool;                // empty = default pool
  std::string tenant;              // <= 128 bytes
  std::string client_sequence_id;  // empty = the service picks one
  CompressionSpec policy;
};

struct AppendParams {
  std::string sequence_id;
  int64_t layer = 0;
  int64_t start_position = 0;
  int64_t num_tokens = 0;
  DType dtype = DType::kF16;
  bool dtype_set = false;  // false = the pool's dtype
  // Dense [num_tokens, num_kv_heads, head_dim] of dtype; borrowed for the call.
  absl::string_view keys;
  absl::string_view values;
};

struct AppendResult {
  int64_t layer_tokens = 0;
  int64_t visible_tokens = 0;
};

enum class FetchFormat : uint8_t { kDense, kStored };

struct FetchParams {
  std::string sequence_id;
  std::vector<int64_t> layers;  // empty = all
  FetchFormat format = FetchFormat::kDense;
  DType dtype = DType::kF16;
  bool dtype_set = false;       // false = the pool's dtype
  int64_t max_chunk_bytes = 0;  // 0 = kDefaultChunkBytes; clamped to [4 KiB, 3 MiB]
  // Serve every token appended to a layer, not only the tokens every layer has.
  bool include_unfinished = false;
};

// One (layer, kv head, token range) of a Fetch. The sink may move the strings out.
struct FetchChunk {
  int layer = 0;
  int kv_head = 0;
  int64_t first_index = 0;
  int num_tokens = 0;
  std::vector<int32_t> positions;
  std::string keys;
  std::string values;
  DType dtype = DType::kF16;
  StorageFormat storage = StorageFormat::kF16;
  int record_bytes = 0;  // kStored only
  bool last = false;
  int64_t visible_tokens = 0;
};

// Receives chunks in order, called without any lock held. Returns false to stop (the
// caller went away); Fetch then returns CANCELLED.
using FetchSink = std::function<bool(FetchChunk& chunk)>;

// Queries of one layer that a scoring policy needs (SnapKV: the last `window` prompt
// queries; H2O at prefill: every prompt query).
struct LayerQueries {
  int64_t layer = 0;
  DType dtype = DType::kF16;
  absl::string_view queries;       // [n, num_query_heads, head_dim] of dtype, borrowed
  std::vector<int32_t> positions;  // [n] position of each query
};

struct CompressParams {
  std::string sequence_id;
  CompressionSpec spec;
  std::vector<LayerQueries> queries;  // SnapKV / H2O: one entry for every layer
};

struct LayerCompressResult {
  int layer = 0;
  int64_t token_heads_before = 0;  // stored tokens summed over the layer's kv heads
  int64_t token_heads_after = 0;
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
};

struct CompressResult {
  std::vector<LayerCompressResult> layers;
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
  StorageFormat storage = StorageFormat::kF16;
};

struct AttendParams {
  std::string sequence_id;
  int64_t layer = 0;
  DType dtype = DType::kF16;       // of queries and output
  absl::string_view queries;       // [n, num_query_heads, head_dim], borrowed
  std::vector<int32_t> positions;  // [n]; each >= the layer's last appended position
  bool want_weights = false;
};

struct AttendResult {
  std::string output;  // [n, num_query_heads, head_dim] of dtype
  // With want_weights: [n, num_query_heads, max_stored] attention weights, and the
  // position of each weight's token [num_kv_heads, max_stored] (-1 = padding).
  std::vector<float> weights;
  std::vector<int32_t> weight_positions;
  int32_t max_stored = 0;
};

struct ReleaseResult {
  int64_t freed_blocks = 0;
  int64_t freed_bytes = 0;
};

struct ListSequencesParams {
  std::string pool;
  std::string tenant;
  int64_t limit = 0;  // 0 = 1000
};

struct SequenceList {
  std::vector<SequenceSnapshot> sequences;
  int64_t total = 0;
};

class KvStore {
 public:
  static constexpr int64_t kDefaultChunkBytes = int64_t{1} << 20;
  static constexpr int64_t kMinChunkBytes = int64_t{4} << 10;
  static constexpr int64_t kMaxChunkBytes = int64_t{3} << 20;

  // Creates the kernel backend and every pool; INVALID_ARGUMENT for bad options or
  // duplicate pool names.
  static absl::StatusOr<std::unique_ptr<KvStore>> Create(const KvStoreOptions& options);
  ~KvStore();

  absl::StatusOr<SequenceSnapshot> CreateSequence(const CreateSequenceParams& params);
  // All-or-nothing: on error nothing of the request was stored.
  absl::StatusOr<AppendResult> Append(const AppendParams& params);
  absl::Status Fetch(const FetchParams& params, const FetchSink& sink);
  // Evicts and/or converts the stored tokens per `spec`. All-or-nothing: a refused or failed
  // Compress leaves the KV data unchanged. Freed blocks return to the pool at once.
  absl::StatusOr<CompressResult> Compress(const CompressParams& params);
  // Attention of `n` query tokens of one layer over every token stored for that layer,
  // computed here by the kernels in the stored format. Accumulates H2O scores.
  absl::StatusOr<AttendResult> Attend(const AttendParams& params);
  absl::StatusOr<SequenceSnapshot> GetSequence(const std::string& sequence_id) const;
  absl::StatusOr<ReleaseResult> Release(const std::string& sequence_id);
  // An operator's eviction: Release, counted as evicted tokens (policy "operator").
  absl::StatusOr<ReleaseResult> Evict(const std::string& sequence_id);

  // While draining, CreateSequence answers UNAVAILABLE; everything else keeps working so
  // in-flight work can finish before shutdown.
  void SetDraining(bool draining) { draining_.store(draining); }
  bool draining() const { return draining_.load(); }

  std::vector<PoolSnapshot> ListPools() const;
  // Empty pool name = every pool summed. NOT_FOUND for an unknown pool.
  absl::StatusOr<PoolStatsSnapshot> GetPoolStats(const std::string& pool) const;
  absl::StatusOr<SequenceList> ListSequences(const ListSequencesParams& params) const;

  // The input dtype of the pool a sequence lives in (NOT_FOUND for unknown sequences).
  absl::StatusOr<DType> SequenceDType(const std::string& sequence_id) const;

  // The pool named `name` (empty = default), or NOT_FOUND listing the pools.
  absl::StatusOr<BlockPool*> FindPool(const std::string& name) const;

 private:
  explicit KvStore(const KvStoreOptions& options) : options_(options) {}
  absl::StatusOr<std::shared_ptr<Sequence>> FindLive(const std::string& id) const;
  absl::StatusOr<ReleaseResult> ReleaseInternal(const std::string& id, bool evicted);
  absl::Status AppendLowBitLocked(Sequence& seq, int layer, int64_t start, int64_t n, DType dtype,
                                  const char* keys, const char* values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());
  // Applies the sequence's automatic policy to `layer` after an append.
  absl::Status ApplyAutomaticPolicyLocked(Sequence& seq, int layer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());
  // Select + compact one layer with the given rule; frees emptied blocks. Returns the
  // token-heads evicted.
  // With `rerotate`, survivors then get in-cache positions (CloseGapsLocked).
  absl::StatusOr<int64_t> EvictLayerLocked(Sequence& seq, int layer, int sinks, int recent,
                                           int budget, bool rerotate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());
  absl::Status CloseGapsLocked(Sequence& seq, int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(seq.mu());
  void CountEvicted(const Sequence& seq, CompressionSpec::Eviction why, int64_t token_heads);
  std::string NewSequenceId();
  size_t PoolIndex(const BlockPool* pool) const;

  const KvStoreOptions options_;
  std::unique_ptr<kernels::KernelBackend> backend_;
  std::vector<std::unique_ptr<BlockPool>> pools_;
  SequenceRegistry registry_;
  std::atomic<int64_t> appended_bytes_{0};
  std::atomic<int64_t> fetched_bytes_{0};
  std::atomic<bool> draining_{false};
  // Token-heads evicted per pool and cause: index 0 = operator (EvictSequence), then the
  // Eviction enum values.
  static constexpr int kEvictionCauses = 4;
  std::vector<std::unique_ptr<std::array<std::atomic<int64_t>, kEvictionCauses>>> evicted_;
  std::atomic<uint64_t> id_counter_{0};
  uint64_t id_salt_ = 0;
};

// INVALID_ARGUMENT / FAILED_PRECONDITION naming the field when `spec` cannot apply to a
// pool of `geometry`. `automatic`: set at CreateSequence (SnapKV needs queries, so only a
// Compress can apply it).
absl::Status ValidateSpec(const CompressionSpec& spec, const PoolGeometry& geometry,
                          bool automatic);

// The newest tokens per lane that `spec`'s eviction always keeps (its recent window); -1 when
// it evicts nothing. A raw residual must fit in it.
int64_t ProtectedRecent(const CompressionSpec& spec);

// Snapshot of a sequence; caller holds its lock (shared is enough).
SequenceSnapshot SnapshotLocked(const Sequence& sequence) ABSL_SHARED_LOCKS_REQUIRED(sequence.mu());

}  // namespace kvc::cachesvc
