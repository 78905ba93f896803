// BlockReservation: blocks of one format taken from a pool for one mutation. Until Commit(),
// the destructor returns every block to the pool, so an error anywhere before the commit leaks
// nothing; after Commit() the blocks belong to the metadata the mutation published. (Not a
// lease: a lease, lease_table.h, pins published blocks for a reader.)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cachesvc/core/pool/block_pool.h"

namespace kvc::cachesvc {

class BlockReservation {
 public:
  // Blocks for `owner` (the sequence's scope: BlockPool::AllocateFor).
  BlockReservation(BlockPool* pool, StorageFormat format, std::string owner)
      : pool_(pool), format_(format), owner_(std::move(owner)) {}
  BlockReservation(BlockReservation&& other) noexcept;
  BlockReservation& operator=(BlockReservation&& other) noexcept;
  BlockReservation(const BlockReservation&) = delete;
  BlockReservation& operator=(const BlockReservation&) = delete;
  ~BlockReservation();

  // Takes `n` more blocks, all or none (the pool's RESOURCE_EXHAUSTED otherwise).
  absl::Status Allocate(int64_t n);
  // The i-th block taken, in allocation order.
  BlockId block(int64_t i) const { return blocks_[static_cast<size_t>(i)]; }
  int64_t size() const { return static_cast<int64_t>(blocks_.size()); }
  StorageFormat format() const { return format_; }
  // The blocks now belong to published metadata; the destructor keeps them.
  void Commit() { blocks_.clear(); }

 private:
  BlockPool* pool_;
  StorageFormat format_;
  std::string owner_;
  std::vector<BlockId> blocks_;
};

}  // namespace kvc::cachesvc
