// Plain domain types of the cache service core. No gRPC, protobuf or Prometheus here:
// the RPC layer converts proto messages to and from these in one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvc/kernels/dtype.h"
#include "kvc/kernels/ops.h"

namespace kvc::cachesvc {

using kernels::DType;
using kernels::RopeStyle;
using kernels::StorageFormat;

// Index of a block inside one pool's arena.
using BlockId = int32_t;

struct RopeParams {
  bool enabled = false;
  double theta = 0;
  int rotary_dim = 0;  // 0 = head_dim
  RopeStyle style = RopeStyle::kNeox;
};

// Fixed shape of every sequence in a pool.
struct PoolGeometry {
  int num_layers = 30;
  int num_kv_heads = 3;
  int num_query_heads = 9;
  int head_dim = 64;
  int block_tokens = 16;
  DType dtype = DType::kF16;
  RopeParams rope;

  // Bytes of one token of one layer, all kv heads, keys only, in `dtype`.
  int64_t TokenLayerBytes(DType d) const {
    return int64_t{num_kv_heads} * head_dim * static_cast<int64_t>(kernels::DTypeSize(d));
  }
};

struct PoolOptions {
  std::string name = "default";
  std::string device = "cpu";
  int64_t capacity_bytes = int64_t{1} << 30;
  PoolGeometry geometry;
  // Host pools: bytes of free blocks whose pages stay resident for reuse (unset: a quarter of
  // capacity_bytes, at most 1 GiB; pool_options.h KeepFreeBytes). Past it, a background
  // thread returns the pages of the oldest free blocks to the OS until half of it is left.
  // >= capacity_bytes keeps every page.
  std::optional<int64_t> keep_free_bytes;
  // Host pools: the size of the segments each format's arena is carved into (host_arena.h):
  // a segment holds one tenant's blocks at a time, and same-node readers map whole segments.
  // Unset: capacity_bytes / 256 rounded up to a power of two, 64 KiB .. 32 MiB; each format
  // rounds it to a multiple of its block bytes and the page size (pool_options.h).
  std::optional<int64_t> segment_bytes;
  // The only scope (tenant) whose sequences this pool holds ("" = any). A device pool is
  // shared over CUDA IPC only with that scope: its one allocation holds every sequence's KV.
  std::string tenant;
};

// A segment of a host pool's arena (block_pool.h SharedArena) as a lease names it: its index and
// the epoch of its current memfd (a segment freed and claimed again gets a new memfd and a higher
// epoch, so a reader can tell a mapping of the old one from the current one).
struct SegmentRef {
  int64_t index = 0;
  uint64_t epoch = 0;
  bool operator==(const SegmentRef& o) const { return index == o.index && epoch == o.epoch; }
};

// One eviction rule x one storage format (x a raw recent residual, not yet served).
// Set at CreateSequence (applied as appends arrive) or sent with Compress.
struct CompressionSpec {
  enum class Eviction : uint8_t { kNone, kStreamingLlm, kSnapKv, kH2o, kExpectedAttention };
  Eviction eviction = Eviction::kNone;
  // StreamingLLM: keep the first `sinks` and the last `window` tokens.
  int sinks = 0;
  int window = 0;
  bool rerotate_keys = false;
  // SnapKV: observation window `window` (above), keep `budget` tokens per kv head.
  int budget = 0;
  int pooling_kernel = 13;  // the measured default (the paper: 7)
  bool pooling_avg = false;
  // SnapKV: share the layer's selections across its kv heads by score (AdaKV), each head
  // first taking head_floor_percent % of its uniform share; per-layer budgets (PyramidKV) when
  // pyramid_beta >= 2.
  bool adaptive = false;
  int head_floor_percent = 20;
  int pyramid_beta = 0;
  // H2O: keep the `heavy` highest-scoring tokens plus the `recent` newest.
  int heavy = 0;
  int recent = 0;
  // Expected Attention: keep `sinks`, the `window` newest and the best of the rest up to
  // `budget` per kv head (adaptive as SnapKV's), scored from query statistics with RoPE
  // averaged over the next `future_positions` positions, times ||v|| when value_norm.
  int future_positions = 512;
  bool value_norm = true;
  StorageFormat storage = StorageFormat::kF16;
  bool storage_set = false;  // false = keep the sequence's current format
  int residual_tokens = 0;

  bool empty() const { return eviction == Eviction::kNone && !storage_set && residual_tokens == 0; }
};

const char* EvictionName(CompressionSpec::Eviction eviction);

struct FormatBytes {
  StorageFormat format = StorageFormat::kF16;
  int64_t blocks = 0;
  int64_t bytes = 0;
};

// A consistent copy of a sequence's state, taken under its lock.
struct SequenceSnapshot {
  std::string id;
  StorageFormat storage = StorageFormat::kF16;
  CompressionSpec policy;
  std::vector<int64_t> stored_tokens;  // [layer][kv head], flattened
  std::string pool;
  std::string tenant;
  int64_t visible_tokens = 0;
  std::vector<int64_t> layer_tokens;
  int64_t stored_token_heads = 0;
  std::vector<FormatBytes> bytes_by_format;
  int64_t bytes = 0;
  double compression_ratio = 1.0;
  int64_t created_unix_ms = 0;
  int64_t attached_tokens = 0;  // tokens that came from the prefix cache at creation
};

struct PoolSnapshot {
  PoolOptions options;
  int64_t block_bytes = 0;
  int64_t total_blocks = 0;  // in the pool's raw format
  int64_t free_blocks = 0;   // raw-format blocks the free bytes would hold
  int64_t used_bytes = 0;    // bytes of blocks in use, every format
  int64_t sequences = 0;
};

// The prefix cache of a pool (prefix_index.h).
struct PrefixStats {
  int64_t lookups = 0;          // Lookup and attach attempts
  int64_t hits = 0;             // of which matched at least one block
  int64_t lookup_tokens = 0;    // tokens asked about (full blocks only)
  int64_t hit_tokens = 0;       // tokens found
  int64_t attached_tokens = 0;  // tokens attached to new sequences
  int64_t checksum_misses = 0;  // entries found corrupt (dropped, counted as misses)
  int64_t corrupt_reads = 0;    // Fetch/Attend/Compress refused: a shared block failed checksum
  int64_t evicted_misses = 0;   // lookups that matched nothing: their first block was evicted
  int64_t published_entries = 0;
  int64_t evicted_entries = 0;
  int64_t entries = 0;             // now
  int64_t cached_bytes = 0;        // bytes of blocks the index holds now
  int64_t unreferenced_bytes = 0;  // of which only the index holds (evictable)
};

// Leases of a pool (lease_table.h).
struct LeaseStats {
  int64_t active = 0;        // leases live now
  int64_t leased_bytes = 0;  // bytes of the blocks they pin (some also held by sequences)
  int64_t granted = 0;       // since start
  int64_t renewed = 0;
  int64_t released = 0;  // ended by ReleaseLease (or an admin's EndLease)
  int64_t expired = 0;   // ended by their TTL
  // Bytes of the blocks that leases pin and no sequence holds any more (in the pool's used
  // bytes, and in the lessees' accounts).
  int64_t lease_only_bytes = 0;
};

struct PoolStatsSnapshot {
  std::string pool;  // empty = all pools
  int64_t capacity_bytes = 0;
  int64_t used_bytes = 0;
  int64_t total_blocks = 0;
  int64_t used_blocks = 0;
  int64_t sequences = 0;
  int64_t visible_tokens = 0;
  int64_t stored_token_heads = 0;
  int64_t dense_bytes = 0;  // what the visible tokens take dense in the pool dtype (K + V)
  std::vector<FormatBytes> bytes_by_format;
  int64_t appended_bytes_total = 0;
  int64_t fetched_bytes_total = 0;
  // Token-heads evicted since start, by what evicted them ("operator", later policies).
  std::vector<std::pair<std::string, int64_t>> evicted_token_heads;
  // Set for one tenant's statistics (TenantPoolStats): used_bytes and sequences are the
  // tenant's, quota_* its limits; the pool-wide counters stay empty.
  std::string tenant;
  int64_t quota_bytes = 0;
  int64_t quota_sequences = 0;
  PrefixStats prefix_cache;  // pool-wide only
  LeaseStats leases;         // pool-wide; a tenant's: only its lease_only_bytes
  // Host pools: bytes of free blocks whose pages are resident, and bytes of pages returned
  // to the OS since start (keep_free_bytes).
  int64_t free_resident_bytes = 0;
  int64_t released_bytes_total = 0;
};

}  // namespace kvc::cachesvc
