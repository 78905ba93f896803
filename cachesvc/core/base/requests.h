// Parameters and results of the data operations (KvStore's API), plain C++. Payloads are
// borrowed for the duration of the call. An unset dtype means the pool's input dtype; the
// core resolves it, so callers need no round trip to learn it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

// `scope` in the params below: the id space the call acts in (tenant_scope.h). A sequence of
// another scope is NOT_FOUND, exactly as an id never created.

// A prefix named by its tokens (prefix_index.h): the client's model id and salt, which
// with the tenant, the pool and the storage format decide which cached blocks may serve it.
struct PrefixSpec {
  std::string model;               // 1-128 bytes
  std::string salt;                // <= 128 bytes; "" is a salt like any other
  std::vector<int32_t> token_ids;  // from position 0; >= 0
};

struct CreateSequenceParams {
  TenantScope scope;
  std::string pool;                // empty = default pool
  std::string tenant;              // <= 128 bytes; the account charged (quotas)
  std::string client_sequence_id;  // empty = the service picks one
  CompressionSpec policy;
  // Start from the longest cached prefix of these tokens (its blocks are shared, not
  // copied); the engine appends from SequenceSnapshot::attached_tokens on.
  std::optional<PrefixSpec> prefix;
};

struct LookupPrefixParams {
  TenantScope scope;
  std::string pool;  // empty = default pool
  PrefixSpec prefix;
  // The storage format a sequence created now would use (its policy's); unset = the pool's
  // raw format.
  std::optional<StorageFormat> format;
};

struct LookupPrefixResult {
  int64_t cached_tokens = 0;  // leading tokens cached now (whole blocks)
  int64_t block_tokens = 0;   // the pool's block size: only whole blocks are cached
};

struct ForkSequenceParams {
  TenantScope scope;
  std::string sequence_id;         // the source
  std::string client_sequence_id;  // the fork's id (optional, as in CreateSequenceParams)
};

// Leases (lease_table.h).
struct LeaseParams {
  TenantScope scope;
  std::string sequence_id;
  std::vector<int32_t> layers;  // empty = every layer, in order
  int64_t ttl_ms = 0;           // 0 = the store's default
};

struct LeasedSegment {
  StorageFormat format = StorageFormat::kF16;
  std::vector<BlockId> blocks;  // stored token i: blocks[i / block_tokens], slot i % block_tokens
  std::vector<int32_t> positions;  // [stored tokens]
};

// One (layer, kv head) lane: its segments, oldest tier first.
struct LeasedLane {
  int32_t layer = 0;
  int32_t kv_head = 0;
  std::vector<LeasedSegment> segments;
};

struct LeaseSnapshot {
  std::string lease_id;
  std::string sequence_id;
  std::string pool;
  std::string device;
  int64_t ttl_ms = 0;
  int64_t expires_unix_ms = 0;
  int32_t block_tokens = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF16;  // the pool's
  // The arenas the lanes' blocks live in, one per format used (block b of a format's arena
  // starts at byte b * layout.block_bytes).
  std::vector<kernels::BlockLayout> layouts;
  // Per entry of `layouts`: the host segments its leased blocks lie in, with their epochs
  // (BlockPool::SegmentsOf; empty for a device pool).
  std::vector<std::vector<SegmentRef>> segments;
  std::vector<int32_t> layers;              // leased layers, in lane order
  std::vector<uint64_t> layer_generations;  // [layers]: the generation each layer was at
  std::vector<int64_t> layer_tokens;        // [layers]: tokens appended to each
  int64_t visible_tokens = 0;
  int64_t leased_bytes = 0;       // bytes of the pinned blocks
  std::vector<LeasedLane> lanes;  // layer-major, kv heads in order
};

// One live lease, as an operator sees it (KvStore::ListLeases).
struct LeaseInfo {
  std::string lease_id;
  TenantScope scope;        // the id space it lives in (the leased sequence's)
  std::string tenant;       // the account it is charged to (the leased sequence's tenant)
  std::string sequence_id;  // the leased sequence (it may have been released since)
  std::string pool;
  int64_t leased_bytes = 0;      // bytes of the blocks it pins
  int64_t lease_only_bytes = 0;  // of which no sequence holds any more
  int64_t granted_unix_ms = 0;
  int64_t expires_unix_ms = 0;
  int64_t renewals = 0;
};

struct ListLeasesParams {
  std::optional<TenantScope> scope;  // unset = every scope
  std::string tenant;                // empty = every tenant (the account charged)
  std::string pool;                  // empty = every pool
};

struct PublishPrefixParams {
  TenantScope scope;
  std::string sequence_id;
  PrefixSpec prefix;  // token ids of the sequence from position 0
};

struct PublishPrefixResult {
  int64_t published_tokens = 0;  // leading tokens now in the prefix cache (whole blocks)
  int64_t new_tokens = 0;        // of which this call added
};

struct AppendParams {
  TenantScope scope;
  std::string sequence_id;
  int64_t layer = 0;
  int64_t start_position = 0;
  int64_t num_tokens = 0;
  std::optional<DType> dtype;
  // Dense [num_tokens, num_kv_heads, head_dim] of dtype.
  absl::string_view keys;
  absl::string_view values;
  // In-process callers only (the RPC layer never sets it): keys and values are memory of the
  // pool's device (KernelBackend::Allocate), read there by the write kernels without staging;
  // never dereferenced on the host. INVALID_ARGUMENT on a host pool.
  bool on_device = false;
  // With on_device, when set: the device the memory is on ("cuda:1"). A sequence whose pool is
  // on another device is FAILED_PRECONDITION (an NCCL Append received into its transfer's pool).
  std::string device;
};

struct AppendResult {
  int64_t layer_tokens = 0;
  int64_t visible_tokens = 0;
};

enum class FetchFormat : uint8_t { kDense, kStored };

struct FetchParams {
  TenantScope scope;
  std::string sequence_id;
  std::vector<int64_t> layers;  // empty = all
  FetchFormat format = FetchFormat::kDense;
  std::optional<DType> dtype;
  int64_t max_chunk_bytes = 0;  // 0 = the default (1 MiB); clamped to [4 KiB, 3 MiB]
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
  std::optional<DType> dtype;
  absl::string_view queries;       // [n, num_query_heads, head_dim] of dtype
  std::vector<int32_t> positions;  // [n] position of each query
};

// Statistics of one layer's context queries before RoPE, per query head (Expected
// Attention). Views into the request, which outlives the call.
struct LayerQueryStats {
  int64_t layer = 0;
  absl::Span<const float> mean;        // [num_query_heads, head_dim]
  absl::Span<const float> covariance;  // [num_query_heads, head_dim, head_dim]; empty = none
};

struct CompressParams {
  TenantScope scope;
  std::string sequence_id;
  CompressionSpec spec;
  std::vector<LayerQueries> queries;         // SnapKV / H2O: one entry for every layer
  std::vector<LayerQueryStats> query_stats;  // Expected Attention: one entry for every layer
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
  TenantScope scope;
  std::string sequence_id;
  int64_t layer = 0;
  std::optional<DType> dtype;      // of queries and output
  absl::string_view queries;       // [n, num_query_heads, head_dim]
  std::vector<int32_t> positions;  // [n]; each >= the layer's last appended position
  bool want_weights = false;
};

struct AttendResult {
  DType dtype = DType::kF16;
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
  std::optional<TenantScope> scope;  // unset = every scope
  std::string pool;
  std::string tenant;
  int64_t limit = 0;       // 0 = 1000
  std::string page_token;  // empty = from the first; else a SequenceList::next_page_token
};

struct SequenceList {
  std::vector<SequenceSnapshot> sequences;  // in creation order
  int64_t total = 0;                        // matching sequences, also those on other pages
  std::string next_page_token;              // empty = this is the last page
};

}  // namespace kvc::cachesvc
