// PrefixIndex: the prefix cache of one pool. Every full block of `block_tokens` tokens of a
// published sequence is an entry, addressed by a key chained from its parent's:
//
//   key[0] = XXH3-128(layout digest || token ids of block 0)
//   key[i] = XXH3-128(key[i-1]      || token ids of block i)
//
// where the layout digest (LayoutDigest) covers everything that changes the stored bytes: the
// model id the client names, the tenant scope and the client's salt, the pool geometry (layers,
// kv heads, head dim, block tokens, dtype, RoPE) and the storage format. An entry holds, for
// every lane (layer x kv head), the pool block of those tokens and an XXH64 checksum of the
// block's bytes taken when it was published (the ChecksumBlocks kernel op). Published blocks are
// frozen (block_shares.h): nobody writes them again, and the index holds each once, so a released
// sequence leaves its published prefix behind as cache. A sequence that attaches an entry holds its
// blocks too.
//
// Collisions: two different prefixes share a key only if XXH3-128 collides (about 2^-64 for
// 2^32 entries); the layout digest keeps different models, tenants, salts, geometries and
// formats apart by construction. Corruption: a block whose checksum no longer matches is a
// miss, never a hit; its entry is removed.
//
// Entries nobody but the index holds are evictable, least recently used first and leaves
// before their parents (an entry whose parent is gone could never be reached); the pool asks
// for that (BlockPool::AllocateOrReclaim) before a live allocation fails. Thread-safe; lock
// order: a sequence's lock, then the index's, then the pool's.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/pool/block_pool.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

struct PrefixKey {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const PrefixKey& o) const { return high == o.high && low == o.low; }
  template <typename H>
  friend H AbslHashValue(H h, const PrefixKey& k) {
    return H::combine(std::move(h), k.high, k.low);
  }
};

// What, besides the tokens, decides the bytes of a cached block.
struct PrefixLayout {
  std::string model;  // the client's model id (weights, tokenizer, anything it must match)
  std::string scope;  // the authenticated tenant ("" without authentication)
  std::string salt;   // the client's salt: only the same salt shares
  StorageFormat format = StorageFormat::kF16;
};

PrefixKey LayoutDigest(const PrefixLayout& layout, const PoolGeometry& geometry);
// One key per full block of `token_ids` (a partial last block has none).
std::vector<PrefixKey> ChainKeys(const PrefixKey& digest, absl::Span<const int32_t> token_ids,
                                 int block_tokens);

// XXH64 of each block's bytes (every slot's records and scales), computed where the pool lives
// (the ChecksumBlocks kernel op).
absl::Status BlockChecksums(BlockPool* pool, StorageFormat format, absl::Span<const BlockId> blocks,
                            std::vector<uint64_t>* out);

class PrefixIndex {
 public:
  explicit PrefixIndex(BlockPool* pool);
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;
  // Lets go of every block it holds.
  ~PrefixIndex();

  // Leading keys cached now (no checksum check, nothing held): a hint.
  int64_t Lookup(absl::Span<const PrefixKey> keys);

  // The blocks of the longest cached run of leading keys in `format`, each held once more
  // for the caller, who must Drop them when done: attached[i][lane] is entry i's block of
  // that lane. Every block's checksum is verified first; the first corrupt entry ends the
  // run and leaves the index. INTERNAL only when reading the blocks fails.
  absl::Status Attach(absl::Span<const PrefixKey> keys, StorageFormat format,
                      std::vector<std::vector<BlockId>>* attached);

  // Keys among `keys` not cached yet, by index.
  std::vector<size_t> Missing(absl::Span<const PrefixKey> keys) const;
  // Publishes entry keys[i] (parent keys[i-1], or none for i == 0) for each i in `which`,
  // with blocks[k][lane] and checksums[k][lane] of which[k]. The blocks are frozen and held by
  // the index. A key published meanwhile by someone else is skipped. Returns entries added.
  int64_t Publish(absl::Span<const PrefixKey> keys, absl::Span<const size_t> which,
                  StorageFormat format, const std::vector<std::vector<BlockId>>& blocks,
                  const std::vector<std::vector<uint64_t>>& checksums);

  // A read found `blocks` corrupt (shared_read_check.h): removes every entry holding one of
  // them, counted as checksum misses. Returns entries removed.
  int64_t DropCorrupt(StorageFormat format, absl::Span<const BlockId> blocks);
  // A Fetch or Attend refused because it would read a corrupt shared block.
  void CountCorruptRead() { corrupt_reads_.fetch_add(1, std::memory_order_relaxed); }

  // Evicts unused entries (least recently used leaves first) until at least `bytes` went
  // back to the pool or none is left; returns the bytes freed.
  int64_t Reclaim(int64_t bytes);

  PrefixStats stats() const;

 private:
  struct Entry {
    PrefixKey parent;
    bool has_parent = false;
    StorageFormat format = StorageFormat::kF16;
    std::vector<BlockId> blocks;      // [lane]
    std::vector<uint64_t> checksums;  // [lane]
    uint64_t last_used = 0;
    int64_t children = 0;
  };
  // Remembers a key Reclaim evicted (the newest kRememberEvicted), so a lookup that then
  // matches nothing can say why.
  void RememberEvictedLocked(const PrefixKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a lookup of `keys` that matched nothing: evicted or no prefix.
  void CountMissLocked(absl::Span<const PrefixKey> keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes an entry and lets go of its blocks.
  void EraseLocked(absl::flat_hash_map<PrefixKey, Entry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UnusedLocked(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t EntryBytes(const Entry& e) const;

  BlockPool* const pool_;
  mutable kvc::Mutex mu_;
  absl::flat_hash_map<PrefixKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  // Recently evicted keys, oldest first in evicted_order_ (16 bytes each in both).
  static constexpr size_t kRememberEvicted = size_t{1} << 16;
  absl::flat_hash_set<PrefixKey> evicted_keys_ ABSL_GUARDED_BY(mu_);
  std::deque<PrefixKey> evicted_order_ ABSL_GUARDED_BY(mu_);
  int64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> lookups_{0}, hits_{0}, lookup_tokens_{0}, hit_tokens_{0},
      attached_tokens_{0}, checksum_misses_{0}, published_{0}, evicted_{0}, corrupt_reads_{0},
      evicted_misses_{0};
};

}  // namespace kvc::cachesvc
