// BlockPool: fixed-size blocks of one storage format carved from a byte capacity, and the
// data movement in and out of them. The host pool implements it with plain memory; a GPU
// pool implements the same interface with device memory and the kernels library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cachesvc/core/types.h"
#include "kvc/kernels/block_layout.h"

namespace kvc::cachesvc {

// Where one token lives: block and slot inside it.
struct TokenSlot {
  BlockId block;
  int slot;
};

class BlockPool {
 public:
  virtual ~BlockPool() = default;

  virtual const PoolOptions& options() const = 0;
  virtual const kernels::BlockLayout& layout() const = 0;
  virtual int64_t total_blocks() const = 0;
  // Thread-safe; a momentary value.
  virtual int64_t free_blocks() const = 0;

  // Takes `n` blocks, all or none: RESOURCE_EXHAUSTED (naming the pool, the need and what
  // is free) when fewer than `n` are free. Thread-safe; O(n).
  virtual absl::Status Allocate(int64_t n, std::vector<BlockId>* out) = 0;
  // Returns blocks. Each must have come from Allocate and not been freed since.
  virtual void Free(absl::Span<const BlockId> blocks) = 0;

  // Stores `slots.size()` tokens of one (layer, kv head). keys/values hold token t at
  // byte offset t * src_stride_bytes (head_dim elements of `dtype`). Positions go to the
  // block's position array; scores are reset to 0. Cannot fail once slots are valid.
  virtual void WriteTokens(absl::Span<const TokenSlot> slots, const uint8_t* keys,
                           const uint8_t* values, int64_t src_stride_bytes, DType dtype,
                           absl::Span<const int32_t> positions) = 0;

  // Reads stored tokens back, dense: token t goes to keys/values at t * head_dim
  // elements of `dtype`, its position to positions[t].
  virtual void ReadTokens(absl::Span<const TokenSlot> slots, DType dtype, uint8_t* keys,
                          uint8_t* values, int32_t* positions) const = 0;

  // Copies token records exactly as stored (record_bytes each), for FETCH_FORMAT_STORED.
  virtual void ReadRecords(absl::Span<const TokenSlot> slots, uint8_t* keys, uint8_t* values,
                           int32_t* positions) const = 0;
};

}  // namespace kvc::cachesvc
