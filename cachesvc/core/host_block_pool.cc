#include "cachesvc/core/host_block_pool.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::StatusOr<std::unique_ptr<HostBlockPool>> HostBlockPool::Create(const PoolOptions& options) {
  KVC_RETURN_IF_ERROR(ValidatePoolOptions(options));
  const PoolGeometry& g = options.geometry;
  const auto layout =
      kernels::MakeBlockLayout(kernels::RawFormatFor(g.dtype), g.head_dim, g.block_tokens);
  const int64_t total_blocks = options.capacity_bytes / static_cast<int64_t>(layout.block_bytes);
  if (total_blocks > int64_t{INT32_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat("pool '", options.name, "': capacity_bytes ",
                                                   options.capacity_bytes, " makes ", total_blocks,
                                                   " blocks; at most 2^31-1 are supported"));
  }
  KVC_ASSIGN_OR_RETURN(HostArena arena,
                       HostArena::Create(static_cast<size_t>(total_blocks) * layout.block_bytes));
  return std::unique_ptr<HostBlockPool>(
      new HostBlockPool(options, layout, std::move(arena), total_blocks));
}

HostBlockPool::HostBlockPool(const PoolOptions& options, const kernels::BlockLayout& layout,
                             HostArena arena, int64_t total_blocks)
    : options_(options),
      layout_(layout),
      storage_dtype_(options.geometry.dtype),
      arena_(std::move(arena)),
      total_blocks_(total_blocks) {
  absl::MutexLock lock(&mu_);
  free_list_.reserve(static_cast<size_t>(total_blocks));
  // Highest id at the bottom so blocks are handed out from the start of the arena.
  for (int64_t i = total_blocks - 1; i >= 0; --i) free_list_.push_back(static_cast<BlockId>(i));
  allocated_.assign(static_cast<size_t>(total_blocks), false);
}

int64_t HostBlockPool::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_list_.size());
}

absl::Status HostBlockPool::Allocate(int64_t n, std::vector<BlockId>* out) {
  KVC_CHECK(n >= 0) << n;
  absl::MutexLock lock(&mu_);
  const int64_t free = static_cast<int64_t>(free_list_.size());
  if (n > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool '", options_.name, "' is full: this request needs ", n, " blocks (",
        n * static_cast<int64_t>(layout_.block_bytes), " bytes) but ", free, " of ", total_blocks_,
        " are free; release sequences or give the pool more capacity_bytes"));
  }
  for (int64_t i = 0; i < n; ++i) {
    const BlockId id = free_list_.back();
    free_list_.pop_back();
    allocated_[static_cast<size_t>(id)] = true;
    out->push_back(id);
  }
  return absl::OkStatus();
}

void HostBlockPool::Free(absl::Span<const BlockId> blocks) {
  absl::MutexLock lock(&mu_);
  for (BlockId id : blocks) {
    KVC_CHECK(id >= 0 && id < total_blocks_)
        << "block " << id << " is not in pool " << options_.name;
    KVC_CHECK(allocated_[static_cast<size_t>(id)]) << "double free of block " << id;
    allocated_[static_cast<size_t>(id)] = false;
    free_list_.push_back(id);
  }
}

void HostBlockPool::WriteTokens(absl::Span<const TokenSlot> slots, const uint8_t* keys,
                                const uint8_t* values, int64_t src_stride_bytes, DType dtype,
                                absl::Span<const int32_t> positions) {
  const size_t d = static_cast<size_t>(layout_.head_dim);
  for (size_t t = 0; t < slots.size(); ++t) {
    uint8_t* block = block_data(slots[t].block);
    const size_t slot = static_cast<size_t>(slots[t].slot);
    kernels::ConvertElements(keys + t * src_stride_bytes, dtype,
                             block + layout_.key_offset + slot * layout_.record_bytes,
                             storage_dtype_, d);
    kernels::ConvertElements(values + t * src_stride_bytes, dtype,
                             block + layout_.value_offset + slot * layout_.record_bytes,
                             storage_dtype_, d);
    std::memcpy(block + layout_.positions_offset + slot * sizeof(int32_t), &positions[t],
                sizeof(int32_t));
    const float zero = 0.0f;
    std::memcpy(block + layout_.scores_offset + slot * sizeof(float), &zero, sizeof zero);
  }
}

void HostBlockPool::ReadTokens(absl::Span<const TokenSlot> slots, DType dtype, uint8_t* keys,
                               uint8_t* values, int32_t* positions) const {
  const size_t d = static_cast<size_t>(layout_.head_dim);
  const size_t out_bytes = d * kernels::DTypeSize(dtype);
  // Runs of consecutive slots in one block are converted in one call: raw records are
  // contiguous, so a run is one memcpy when the dtype matches.
  size_t t = 0;
  while (t < slots.size()) {
    size_t run = 1;
    while (t + run < slots.size() && slots[t + run].block == slots[t].block &&
           slots[t + run].slot == slots[t].slot + static_cast<int>(run)) {
      ++run;
    }
    const uint8_t* block = block_data(slots[t].block);
    const size_t slot = static_cast<size_t>(slots[t].slot);
    kernels::ConvertElements(block + layout_.key_offset + slot * layout_.record_bytes,
                             storage_dtype_, keys + t * out_bytes, dtype, run * d);
    kernels::ConvertElements(block + layout_.value_offset + slot * layout_.record_bytes,
                             storage_dtype_, values + t * out_bytes, dtype, run * d);
    std::memcpy(positions + t, block + layout_.positions_offset + slot * sizeof(int32_t),
                run * sizeof(int32_t));
    t += run;
  }
}

void HostBlockPool::ReadRecords(absl::Span<const TokenSlot> slots, uint8_t* keys, uint8_t* values,
                                int32_t* positions) const {
  const size_t rb = layout_.record_bytes;
  for (size_t t = 0; t < slots.size(); ++t) {
    const uint8_t* block = block_data(slots[t].block);
    const size_t slot = static_cast<size_t>(slots[t].slot);
    std::memcpy(keys + t * rb, block + layout_.key_offset + slot * rb, rb);
    std::memcpy(values + t * rb, block + layout_.value_offset + slot * rb, rb);
    std::memcpy(positions + t, block + layout_.positions_offset + slot * sizeof(int32_t),
                sizeof(int32_t));
  }
}

}  // namespace kvc::cachesvc
