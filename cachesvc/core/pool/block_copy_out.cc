// BlockPool::CopyBlocksOut: whole leased blocks into host memory (a TCP transfer channel) or
// the pool's own memory (a sender that sends from the device).
// The one place besides the pools that computes a block's address: it hands it straight to
// the backend's copy op (check_deps.sh lets this file through for that).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/block_pool.h"

namespace kvc::cachesvc {

absl::Status BlockPool::CopyBlocksOut(StorageFormat format, absl::Span<const BlockId> blocks,
                                      absl::Span<const int32_t> slots, char* dst, CopyTo to) {
  if (slots.size() != blocks.size()) return absl::InternalError("CopyBlocksOut: slots != blocks");
  const kernels::PagedArena a = arena(format);
  const kernels::BlockLayout& l = a.layout;
  kernels::KernelBackend* const b = backend();
  const kernels::StreamHandle stream;
  const auto copy = [&](char* out, const char* in, size_t bytes) {
    return to == CopyTo::kHost ? b->CopyToHost(out, in, bytes, stream)
                               : b->CopyOnDevice(out, in, bytes, stream);
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId id = blocks[i];
    if (id < 0 || id >= a.num_blocks) {
      return absl::InternalError(absl::StrCat("CopyBlocksOut: block ", id, " is outside the ",
                                              kernels::StorageFormatName(format), " arena"));
    }
    char* out = dst + i * l.block_bytes;
    const char* in = static_cast<const char*>(a.base) + static_cast<size_t>(id) * l.block_bytes;
    const auto n = static_cast<size_t>(std::clamp(slots[i], 0, l.block_tokens));
    kernels::KernelStatus ks;
    if (n == static_cast<size_t>(l.block_tokens)) {
      ks = copy(out, in, l.block_bytes);
    } else {
      if (to == CopyTo::kHost) {
        std::memset(out, 0, l.block_bytes);
      } else {
        ks = b->Memset(out, 0, l.block_bytes, stream);
      }
      if (ks.ok()) ks = copy(out + l.key_offset, in + l.key_offset, n * l.record_bytes);
      if (ks.ok()) ks = copy(out + l.value_offset, in + l.value_offset, n * l.record_bytes);
    }
    if (!ks.ok()) return absl::InternalError(absl::StrCat("CopyBlocksOut: ", ks.detail));
  }
  const kernels::KernelStatus ks = b->Synchronize(stream);
  if (!ks.ok()) return absl::InternalError(absl::StrCat("CopyBlocksOut: ", ks.detail));
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
