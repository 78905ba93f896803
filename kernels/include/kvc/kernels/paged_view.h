// Plain views of the paged KV memory that every op takes: an arena of fixed-size blocks
// (host memory for the reference/CPU backends, device memory for CUDA) and per-lane block
// lists. A lane is the ordered block list of ONE (sequence, layer, kv head); its stored
// token t lives in block block_ids[block_offsets[lane] + t / block_tokens], slot
// t % block_tokens. All pointers inside a view must be readable by the backend that runs
// the op (device pointers for CUDA; see KernelBackend::Allocate).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/kernels/block_layout.h"
#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

// Opaque stream. For CUDA, `native` is a cudaStream_t (nullptr = the legacy default
// stream); host backends run ops synchronously and ignore it.
struct StreamHandle {
  void* native = nullptr;
};

struct PagedArena {
  void* base = nullptr;    // block b starts at base + b * layout.block_bytes; 64-byte aligned
  BlockLayout layout;      // format, head_dim, block_tokens and section offsets
  int32_t num_blocks = 0;  // block ids must be in [0, num_blocks)
};

// CSR list of lanes. Stored tokens of a lane are always the prefix 0..num_tokens-1 of its
// block list. Per-token arrays that go with a LaneTable (positions, scores, keep masks,
// weights) are dense [num_lanes, max_tokens]: stored token t of lane l at l * max_tokens + t.
struct LaneTable {
  int32_t num_lanes = 0;
  const int32_t* block_offsets = nullptr;  // [num_lanes + 1], nondecreasing, [0] == 0
  const int32_t* block_ids = nullptr;      // [block_offsets[num_lanes]]
  const int32_t* num_tokens = nullptr;     // [num_lanes], <= blocks of the lane * block_tokens
  int32_t max_tokens = 0;  // >= every num_tokens[i]; the row stride of per-lane outputs
};

KVC_HD uint8_t* BlockBase(const PagedArena& a, int32_t block) {
  return static_cast<uint8_t*>(a.base) + static_cast<size_t>(block) * a.layout.block_bytes;
}
KVC_HD uint8_t* KeyRecord(const PagedArena& a, int32_t block, int32_t slot) {
  return BlockBase(a, block) + a.layout.key_offset +
         static_cast<size_t>(slot) * a.layout.record_bytes;
}
KVC_HD uint8_t* ValueRecord(const PagedArena& a, int32_t block, int32_t slot) {
  return BlockBase(a, block) + a.layout.value_offset +
         static_cast<size_t>(slot) * a.layout.record_bytes;
}

// Block id and slot of stored token t of `lane`.
KVC_HD void LaneTokenSlot(const LaneTable& lanes, int block_tokens, int32_t lane, int32_t t,
                          int32_t* block, int32_t* slot) {
  *block = lanes.block_ids[lanes.block_offsets[lane] + t / block_tokens];
  *slot = t % block_tokens;
}

}  // namespace kvc::kernels
