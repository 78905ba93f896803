// BlockShares: which blocks of a pool are shared and by how many holders. A block published
// in the prefix index is frozen: from then on no holder writes it in place (the lane planner
// copies it into a fresh block first: copy-on-write), so every sequence that attached it, and
// the index itself, keeps seeing the bytes that were checksummed. A published block stays
// frozen until its last holder drops it and it returns to the pool; a block frozen without a
// checksum (shared by a fork or pinned by a lease) thaws when one holder is left. A block that was
// never frozen has exactly one holder (its sequence) and no entry here, so the append and
// compaction paths of unshared sequences pay one hash lookup per rewritten block at most. A
// published block also carries the checksum taken when it was published, so reads can re-verify it
// (shared_read_check.h), and a block found corrupt stays marked until it returns to the pool.
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "cachesvc/core/types.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class BlockShares {
 public:
  // Marks blocks immutable; each gains `extra_holders` holders beyond its current ones (a
  // block not yet frozen has one: the sequence that wrote it).
  void Freeze(StorageFormat format, absl::Span<const BlockId> blocks, int extra_holders);
  // Records checksums[i] (XXH64 of the block's bytes) for frozen blocks[i].
  void SetChecksums(StorageFormat format, absl::Span<const BlockId> blocks,
                    absl::Span<const uint64_t> checksums);
  // One more holder for each block; every block must be frozen.
  void Hold(StorageFormat format, absl::Span<const BlockId> blocks);
  // Drops one holder of each block; appends to `last` the blocks whose last holder this was
  // (the caller returns them to the pool).
  void Drop(StorageFormat format, absl::Span<const BlockId> blocks, std::vector<BlockId>* last);

  bool Frozen(StorageFormat format, BlockId block) const;
  // Frozen with a checksum: the prefix index holds it, or held it until the entry was dropped
  // (a fork freezes blocks without one).
  bool Published(StorageFormat format, BlockId block) const;
  // Appends the blocks among `blocks` that have a recorded checksum, and that checksum.
  void Checksummed(StorageFormat format, absl::Span<const BlockId> blocks,
                   std::vector<BlockId>* which, std::vector<uint64_t>* checksums) const;
  // Marks a frozen block corrupt: Corrupt() says so until its last holder drops it.
  void MarkCorrupt(StorageFormat format, BlockId block);
  bool Corrupt(StorageFormat format, BlockId block) const;
  // Blocks marked corrupt now, all formats. Lock-free read: readers skip the per-block
  // lookups while it is 0.
  int64_t corrupt_blocks() const { return corrupt_.load(std::memory_order_acquire); }
  // Holders of a block (1 for a block that was never frozen).
  int64_t Holders(StorageFormat format, BlockId block) const;
  // Frozen blocks now, all formats. Lock-free read.
  int64_t frozen_blocks() const { return frozen_.load(std::memory_order_relaxed); }

 private:
  struct Share {
    int32_t holders = 1;
    bool has_checksum = false;
    bool corrupt = false;
    uint64_t checksum = 0;
  };
  mutable kvc::Mutex mu_;
  std::array<absl::flat_hash_map<BlockId, Share>, kernels::kNumStorageFormats> shares_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> frozen_{0};
  std::atomic<int64_t> corrupt_{0};
};

}  // namespace kvc::cachesvc
