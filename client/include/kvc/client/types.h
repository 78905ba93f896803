// Plain types of the kvcache client API. No generated protobuf types: engines depend on
// this header and Abseil only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace kvc::client {

// Element type of dense keys/values. The numbers are kvcache.v1's, the rows those of the
// kernels' table (kvc/kernels/dtype.h KVC_DTYPES; checked at compile time in convert.cc).
enum class DType { kPoolDefault = 0, kF32 = 1, kF16 = 2, kBF16 = 3 };

// Bytes per element; 0 for kPoolDefault.
constexpr int DTypeBytes(DType dtype) {
  return dtype == DType::kF32 ? 4 : (dtype == DType::kPoolDefault ? 0 : 2);
}
const char* DTypeName(DType dtype);

// Storage formats, as in kvcache.v1.StorageFormat: the rows of kvc/kernels/dtype.h's
// KVC_STORAGE_FORMATS (checked at compile time in client/src/convert.cc).
enum class StorageFormat {
  kPoolDefault = 0,
  kF32 = 1,
  kF16 = 2,
  kBF16 = 3,
  kFp8E4M3 = 4,
  kInt8 = 5,
  kInt4G32 = 6,
  kInt4G64 = 7,
  kNvfp4 = 8
};
const char* StorageFormatName(StorageFormat format);

struct RopeInfo {
  bool enabled = false;
  double theta = 0;
  int rotary_dim = 0;
  bool gptj_style = false;  // false = NeoX pairing
};

struct PoolGeometry {
  int num_layers = 0;
  int num_kv_heads = 0;
  int num_query_heads = 0;
  int head_dim = 0;
  int block_tokens = 0;
  DType dtype = DType::kF16;
  RopeInfo rope;
};

struct FormatBytes {
  StorageFormat format = StorageFormat::kPoolDefault;
  int64_t blocks = 0;
  int64_t bytes = 0;
};

// One eviction rule x one storage format x an optional raw recent residual
// (kvcache.v1.CompressionSpec).
struct CompressionSpec {
  enum class Eviction { kNone, kStreamingLlm, kSnapKv, kH2o, kExpectedAttention };
  Eviction eviction = Eviction::kNone;
  int sinks = 0;   // StreamingLLM; Expected Attention (-1 = the server's default, 4)
  int window = 0;  // StreamingLLM/Expected Attention recent window; SnapKV observation window
  bool rerotate_keys = false;
  int budget = 0;  // SnapKV/Expected Attention tokens kept per kv head (incl. window, sinks)
  int pooling_kernel = 13;   // SnapKV (measured default; the paper: 7)
  bool pooling_avg = false;  // SnapKV: avg instead of max pooling
  // SnapKV: share each layer's selections across its kv heads by score (AdaKV), every head
  // first taking head_floor_percent % of its share (-1 = the server's default, 20).
  bool adaptive = false;
  int head_floor_percent = -1;
  int pyramid_beta = 0;  // SnapKV: >= 2 gives lower layers more (PyramidKV: 20); 0 = flat
  int heavy = 0;         // H2O
  int recent = 0;        // H2O
  // Expected Attention: RoPE averaged over this many next positions (0 = 512); rank without
  // the ||v|| factor when skip_value_norm.
  int future_positions = 0;
  bool skip_value_norm = false;
  StorageFormat storage = StorageFormat::kPoolDefault;  // kPoolDefault = keep
  // The newest tokens of every lane kept raw, quantized as they age out; must fit in the
  // eviction's recent window. A Compress may set it only on a sequence still stored raw.
  int residual_tokens = 0;

  static CompressionSpec StreamingLlm(int sinks, int window) {
    CompressionSpec s;
    s.eviction = Eviction::kStreamingLlm;
    s.sinks = sinks;
    s.window = window;
    return s;
  }
  static CompressionSpec SnapKv(int window, int budget, int pooling_kernel = 13) {
    CompressionSpec s;
    s.eviction = Eviction::kSnapKv;
    s.window = window;
    s.budget = budget;
    s.pooling_kernel = pooling_kernel;
    return s;
  }
  static CompressionSpec H2o(int heavy, int recent) {
    CompressionSpec s;
    s.eviction = Eviction::kH2o;
    s.heavy = heavy;
    s.recent = recent;
    return s;
  }
  // Query-agnostic: scores from statistics of the context's queries (Compress's query_stats),
  // so one compressed document serves any question.
  static CompressionSpec ExpectedAttention(int window, int budget, int sinks = -1) {
    CompressionSpec s;
    s.eviction = Eviction::kExpectedAttention;
    s.window = window;
    s.budget = budget;
    s.sinks = sinks;
    return s;
  }
  // SnapKV's or Expected Attention's budget shared across a layer's kv heads by score (AdaKV).
  CompressionSpec& Adaptive(int floor_percent = -1) {
    adaptive = true;
    head_floor_percent = floor_percent;
    return *this;
  }
  CompressionSpec& WithStorage(StorageFormat format) {
    storage = format;
    return *this;
  }
};

struct SequenceInfo {
  std::string sequence_id;
  std::string pool;
  std::string tenant;
  int64_t visible_tokens = 0;         // every layer has them; the logical length
  std::vector<int64_t> layer_tokens;  // appended per layer
  int64_t stored_token_heads = 0;
  std::vector<FormatBytes> bytes_by_format;
  int64_t bytes = 0;
  double compression_ratio = 1.0;
  int64_t created_unix_ms = 0;
  StorageFormat storage = StorageFormat::kPoolDefault;
  std::vector<int64_t> stored_tokens;  // [num_layers][num_kv_heads]
  int64_t attached_tokens = 0;         // came from the prefix cache at creation
  // The automatic policy it was created with; none when it has none. A wire spec's
  // unspecified pooling or allocation reads as max or uniform (the server sends them set).
  std::optional<CompressionSpec> policy;
};

struct PoolInfo {
  std::string name;
  std::string device;
  PoolGeometry geometry;
  int64_t capacity_bytes = 0;
  int64_t block_bytes = 0;
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;
  int64_t used_bytes = 0;
  int64_t sequences = 0;
};

struct PoolStats {
  std::string pool;  // empty = all pools
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t free_bytes = 0;
  int64_t total_blocks = 0;
  int64_t used_blocks = 0;
  int64_t sequences = 0;
  int64_t visible_tokens = 0;
  int64_t stored_token_heads = 0;
  std::vector<FormatBytes> bytes_by_format;
  int64_t appended_bytes_total = 0;
  int64_t fetched_bytes_total = 0;
  int64_t dense_bytes = 0;  // what the visible tokens would take dense (K + V)
  // Token-heads evicted since start, by what evicted them ("operator": EvictSequence),
  // sorted by rule.
  std::vector<std::pair<std::string, int64_t>> evicted_token_heads;
  // Set when these are one tenant's statistics (a non-admin caller with authentication on):
  // used_bytes and sequences are the tenant's, quota_* its limits (0 = unlimited).
  std::string tenant;
  int64_t quota_bytes = 0;
  int64_t quota_sequences = 0;
  // The prefix cache (pool-wide statistics only: has_prefix_cache says whether the server
  // sent it). Hit rate: hit_tokens / lookup_tokens.
  bool has_prefix_cache = false;
  struct PrefixCache {
    int64_t lookups = 0, hits = 0, lookup_tokens = 0, hit_tokens = 0, attached_tokens = 0;
    int64_t checksum_misses = 0, published_entries = 0, evicted_entries = 0, entries = 0;
    int64_t cached_bytes = 0, unreferenced_bytes = 0;
    int64_t corrupt_reads = 0;   // reads refused: a shared block failed its checksum
    int64_t evicted_misses = 0;  // lookups that matched nothing: first block evicted since
  } prefix_cache;
  // Leases (has_leases: the server sent them). Pool-wide; in a tenant's statistics only
  // lease_only_bytes, the tenant's own.
  bool has_leases = false;
  struct Leases {
    int64_t active = 0, leased_bytes = 0, granted = 0, renewed = 0, released = 0, expired = 0;
    // Bytes of blocks that leases pin and no sequence holds any more (part of used_bytes).
    int64_t lease_only_bytes = 0;
  } leases;
};

// Who a kvcached is in a cluster (AdminService.GetServerInfo).
struct ServerInfo {
  std::string shard;        // cluster name; empty = not a cluster shard
  std::string incarnation;  // 8 hex digits drawn at each start; a change = a restart
  double weight = 1.0;      // placement weight
  bool draining = false;    // takes no new sequences
  int64_t started_unix_ms = 0;
  // Same-node reads: the server's unix socket for mapping its host pools ("" = none) and the
  // token its greeting carries.
  std::string local_socket;
  std::string local_token;
  // Transfers (readers on other nodes): the server's transfer port; 0 = it offers none.
  int32_t transfer_port = 0;
  // NCCL transfers: the NCCL serving them ("NCCL 2.28.9 (libnccl.so.2)"); "" = not offered.
  std::string nccl_transfers;
};

// What one tenant holds and may hold (AdminService.ListTenants).
struct TenantUsage {
  std::string tenant;
  int64_t sequences = 0;
  std::vector<std::pair<std::string, int64_t>> pool_bytes;  // (pool, bytes), by pool name
  int32_t open_streams = 0;
  int32_t compute_calls = 0;
  int64_t quota_bytes_per_pool = 0;  // 0 = unlimited
  int64_t quota_sequences = 0;
  int32_t quota_streams = 0;
  int32_t quota_compute_calls = 0;
  // Of pool_bytes: blocks only its leases pin, (pool, bytes) by pool name.
  std::vector<std::pair<std::string, int64_t>> lease_only_bytes;
};

// One live lease (AdminService.ListLeases).
struct LeaseInfo {
  std::string lease_id;
  std::string tenant;       // the tenant charged for it (the leased sequence's)
  std::string sequence_id;  // the leased sequence (it may have been released since)
  std::string pool;
  int64_t leased_bytes = 0;      // bytes of the blocks it pins
  int64_t lease_only_bytes = 0;  // of which no sequence holds any more
  int64_t granted_unix_ms = 0;
  int64_t expires_unix_ms = 0;
  int64_t renewals = 0;  // RenewLease calls that extended it
};

// What AdminClient::EvictSequence freed.
struct EvictResult {
  int64_t freed_blocks = 0;
  int64_t freed_bytes = 0;
};

// AdminClient::Drain's answer: whether the server drains now, and the sequences it holds.
struct DrainResult {
  bool draining = false;
  int64_t sequences = 0;
};

// A prefix named by its token ids (from position 0). Cached KV serves it only for the same
// model id, salt, tenant, pool and storage format; only whole blocks are cached.
struct Prefix {
  std::string model;  // 1-128 bytes: name the weights (and anything else that changes K/V)
  std::string salt;   // only the same salt shares
  std::vector<int32_t> token_ids;
};

struct CreateSequenceOptions {
  std::string pool;  // empty = the server's default pool
  std::string tenant;
  std::string client_sequence_id;  // empty = the server picks one
  CompressionSpec policy;          // automatic policy (StreamingLLM, H2O, storage format)
  // Start from the longest cached prefix of these tokens (SequenceInfo::attached_tokens);
  // append from there.
  std::optional<Prefix> prefix;
};

// A lease (KvCacheService.LeaseSequence): where a sequence's records are in the pool's
// arenas, pinned until released or expired. Field meanings: proto/kvcache/v1.
// A device pool's memory as the server shares it on its node (the client library's internal
// ShareDeviceArena, client/src/transfer_rpcs.h): the CUDA IPC handle of the pool's one allocation,
// on device ordinal `device`, `bytes` long. Every storage format's arena starts at the allocation's
// start (LeaseArena.block_bytes places a block). kvc/client/device_reader.h opens it and reads
// leases through it.
struct DeviceArenaHandle {
  std::string server_token;  // the local socket's greeting token: its leases carry the same
  int32_t device = -1;
  int64_t bytes = 0;
  std::array<uint8_t, 64> cuda_ipc{};
};

// An NCCL transfer opened for a reader (client/src/transfer_rpcs.h OpenNcclTransfer;
// kvc::client::NcclLink joins and reads it).
struct NcclTransfer {
  std::string transfer_id;
  std::string unique_id;  // ncclUniqueId, 128 bytes
  int64_t connect_within_ms = 0;
  int32_t nccl_version = 0;  // the server's
};

// A host segment of an arena that a lease's blocks lie in, and the epoch of the memory that
// backs it (same-node readers map it again when the epoch moved on).
struct LeaseArenaSegment {
  int64_t index = 0;
  uint64_t epoch = 0;
};
struct LeaseArena {
  StorageFormat format = StorageFormat::kPoolDefault;
  int64_t block_bytes = 0;   // block b starts at byte b * block_bytes of the format's arena
  int64_t record_bytes = 0;  // one token's K (or V) record
  int64_t key_offset = 0;    // K record of slot i: key_offset + i * record_bytes in its block
  int64_t value_offset = 0;
  std::vector<LeaseArenaSegment> segments;  // host pools only
};
struct LeaseSegment {
  StorageFormat format = StorageFormat::kPoolDefault;
  std::vector<int32_t> blocks;     // token i: blocks[i / block_tokens], slot i % block_tokens
  std::vector<int32_t> positions;  // original position of each stored token
};
struct LeaseLane {
  int32_t layer = 0;
  int32_t kv_head = 0;
  std::vector<LeaseSegment> segments;  // oldest tier first
};
struct Lease {
  std::string lease_id;
  std::string sequence_id;
  std::string pool;
  std::string device;
  int64_t ttl_ms = 0;
  int64_t expires_unix_ms = 0;
  int32_t block_tokens = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kPoolDefault;  // the pool's input dtype
  std::vector<LeaseArena> arenas;
  std::vector<int32_t> layers;
  std::vector<uint64_t> layer_generations;
  std::vector<int64_t> layer_tokens;
  int64_t visible_tokens = 0;
  int64_t leased_bytes = 0;
  std::vector<LeaseLane> lanes;  // layers x kv heads, layer-major
  // The granting server's local-socket token (ServerInfo::local_token): a same-node read of
  // this lease is from that server's memory only.
  std::string local_token;
  // The arena description of `format`, or null when no lane uses it.
  const LeaseArena* arena(StorageFormat format) const {
    for (const LeaseArena& a : arenas) {
      if (a.format == format) return &a;
    }
    return nullptr;
  }
};

struct PublishResult {
  int64_t published_tokens = 0;  // leading tokens of the sequence now cached
  int64_t new_tokens = 0;        // of which this call added
};

// Query vectors of one layer for Compress: [positions.size(), num_query_heads, head_dim].
struct LayerQueries {
  int layer = 0;
  DType dtype = DType::kPoolDefault;
  const void* queries = nullptr;
  size_t bytes = 0;
  std::vector<int32_t> positions;
};

// Statistics of one layer's context queries BEFORE RoPE, for Expected Attention.
struct LayerQueryStats {
  int layer = 0;
  std::vector<float> mean;        // [num_query_heads, head_dim]
  std::vector<float> covariance;  // [num_query_heads, head_dim, head_dim]; empty = mean only
};

struct LayerCompressStats {
  int layer = 0;
  int64_t token_heads_before = 0;
  int64_t token_heads_after = 0;
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
};

struct AttendRequest {
  std::string sequence_id;
  int layer = 0;
  DType dtype = DType::kPoolDefault;
  const void* queries = nullptr;  // [positions.size(), num_query_heads, head_dim]
  size_t bytes = 0;
  std::vector<int32_t> positions;  // each >= the layer's last appended position
  bool return_weights = false;
};

struct AttendResult {
  std::string output;  // [n, num_query_heads, head_dim] of dtype
  DType dtype = DType::kPoolDefault;
  int max_stored = 0;
  std::vector<float> weights;             // [n, num_query_heads, max_stored]
  std::vector<int32_t> weight_positions;  // [num_kv_heads, max_stored], -1 = padding
};

// One layer's new tokens. keys/values: dense [num_tokens, num_kv_heads, head_dim] of
// dtype, borrowed for the duration of the call.
struct AppendChunk {
  std::string sequence_id;
  int layer = 0;
  int64_t start_position = 0;
  int num_tokens = 0;
  DType dtype = DType::kPoolDefault;
  const void* keys = nullptr;
  const void* values = nullptr;
  size_t bytes = 0;  // bytes of keys (== bytes of values)
};

struct AppendResult {
  int64_t layer_tokens = 0;
  int64_t visible_tokens = 0;
};

struct AppendStreamResult {
  int64_t messages = 0;
  int64_t tokens = 0;
  int64_t visible_tokens = 0;
};

struct FetchOptions {
  std::vector<int> layers;  // empty = all
  DType dtype = DType::kPoolDefault;
  bool stored_format = false;   // true: token records as stored, with scales
  int64_t max_chunk_bytes = 0;  // 0 = server default (1 MiB)
  // Also tokens appended to a layer that other layers do not have yet (layer-by-layer
  // prefill attends to its own chunk).
  bool include_unfinished = false;
};

// One (layer, kv head, token range) as it arrives.
struct FetchedChunk {
  int layer = 0;
  int kv_head = 0;
  int64_t first_index = 0;
  int num_tokens = 0;
  std::vector<int32_t> positions;
  std::string keys;  // [num_tokens, head_dim] of dtype, or num_tokens stored records
  std::string values;
  DType dtype = DType::kPoolDefault;
  StorageFormat storage = StorageFormat::kPoolDefault;
  int record_bytes = 0;
  int64_t visible_tokens = 0;
};

// A whole fetch assembled per (layer, kv head), in request order. With stored_format, a lane
// of a sequence that keeps a raw recent residual arrives as two FetchedHeads of the same
// (layer, kv head): its low-bit tokens, then its raw tokens (first_index says where the
// second part starts in the lane); each has its own storage and record_bytes.
struct FetchedHead {
  int layer = 0;
  int kv_head = 0;
  int64_t first_index = 0;                              // stored index of the first token here
  StorageFormat storage = StorageFormat::kPoolDefault;  // stored_format only
  int record_bytes = 0;                                 // stored_format only
  std::vector<int32_t> positions;
  std::string keys;
  std::string values;
};

struct FetchResult {
  int64_t visible_tokens = 0;
  DType dtype = DType::kPoolDefault;
  // The path this fetch took: "shared-memory (PATH)", "transfer (HOST:PORT)" or "grpc (why
  // not one of those)". KvCacheClient::DataPath() says what the client decided; a fetch the
  // decided path could not serve (a device pool's lease, a broken channel) says so here.
  std::string path;
  // stored_format: of the first head (the low-bit part); see FetchedHead for each part.
  StorageFormat storage = StorageFormat::kPoolDefault;
  int record_bytes = 0;
  std::vector<FetchedHead> heads;
};

// Where FetchInto writes one layer: the caller's own memory (an engine's KV buffers), keys
// and values each laid out [num_kv_heads][capacity_tokens][head_dim] of FetchIntoOptions'
// dtype. Lane (layer, h)'s tokens fill rows [0, n) of head h; rows from n on are untouched.
struct LayerBuffers {
  int32_t layer = 0;
  void* keys = nullptr;
  void* values = nullptr;
  int64_t capacity_tokens = 0;
};

struct FetchIntoOptions {
  DType dtype = DType::kPoolDefault;  // F16, BF16 or F32: what the buffers hold (required)
  int32_t num_kv_heads = 0;           // the buffers' shape; must match the sequence's
  int32_t head_dim = 0;
  bool include_unfinished = false;  // as FetchOptions
  bool positions = false;           // also return each token's original position
};

struct FetchIntoResult {
  int64_t visible_tokens = 0;
  std::string path;  // as FetchResult::path
  // Rows written per lane: buffers x kv heads, in buffer order (layer-major).
  std::vector<int64_t> lane_tokens;
  // With options.positions: each lane's positions, lanes in lane_tokens' order, concatenated.
  std::vector<int32_t> positions;
};

struct ReleaseResult {
  int64_t freed_blocks = 0;
  int64_t freed_bytes = 0;
};

struct ListSequencesOptions {
  std::string pool;
  std::string tenant;
  int limit = 0;           // 0 = server default (1000)
  std::string page_token;  // empty = the first page; else SequenceList::next_page_token
};

struct SequenceList {
  std::vector<SequenceInfo> sequences;  // in creation order
  int64_t total = 0;                    // matching sequences, also those on other pages
  std::string next_page_token;          // empty = the last page
};

struct CompressResult {
  std::vector<LayerCompressStats> layers;
  int64_t bytes_before = 0;
  int64_t bytes_after = 0;
  StorageFormat storage = StorageFormat::kPoolDefault;
  SequenceInfo sequence;  // after compression
};

}  // namespace kvc::client
