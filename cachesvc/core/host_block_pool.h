// HostBlockPool: a BlockPool in host memory. One arena of fixed-size blocks; a LIFO free
// list gives O(1) allocate and free per block (LIFO also reuses warm memory first).
#pragma once

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachesvc/core/block_pool.h"
#include "cachesvc/core/host_arena.h"

namespace kvc::cachesvc {

class HostBlockPool final : public BlockPool {
 public:
  // Validates options (geometry, capacity >= one block) and maps the arena.
  static absl::StatusOr<std::unique_ptr<HostBlockPool>> Create(const PoolOptions& options);

  const PoolOptions& options() const override { return options_; }
  const kernels::BlockLayout& layout() const override { return layout_; }
  int64_t total_blocks() const override { return total_blocks_; }
  int64_t free_blocks() const override;

  absl::Status Allocate(int64_t n, std::vector<BlockId>* out) override;
  void Free(absl::Span<const BlockId> blocks) override;

  void WriteTokens(absl::Span<const TokenSlot> slots, const uint8_t* keys, const uint8_t* values,
                   int64_t src_stride_bytes, DType dtype,
                   absl::Span<const int32_t> positions) override;
  void ReadTokens(absl::Span<const TokenSlot> slots, DType dtype, uint8_t* keys, uint8_t* values,
                  int32_t* positions) const override;
  void ReadRecords(absl::Span<const TokenSlot> slots, uint8_t* keys, uint8_t* values,
                   int32_t* positions) const override;

 private:
  HostBlockPool(const PoolOptions& options, const kernels::BlockLayout& layout, HostArena arena,
                int64_t total_blocks);
  uint8_t* block_data(BlockId id) const {
    return arena_.data() + static_cast<size_t>(id) * layout_.block_bytes;
  }

  const PoolOptions options_;
  const kernels::BlockLayout layout_;
  const DType storage_dtype_;
  HostArena arena_;
  const int64_t total_blocks_;

  mutable absl::Mutex mu_;
  std::vector<BlockId> free_list_ ABSL_GUARDED_BY(mu_);
  // Debug aid against double frees: allocated_[id] is true while the block is out.
  std::vector<bool> allocated_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
