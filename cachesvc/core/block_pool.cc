#include "cachesvc/core/block_pool.h"

namespace kvc::cachesvc {

int64_t BlockPool::Drop(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder) {
  std::vector<BlockId> last;
  last.reserve(blocks.size());
  shares_.Drop(format, blocks, holder, &last);
  if (!last.empty()) Free(format, last);
  return static_cast<int64_t>(last.size());
}

int64_t BlockPool::Unpin(StorageFormat format, absl::Span<const BlockId> blocks,
                         const LeaseCharge& charge) {
  std::vector<BlockId> last;
  last.reserve(blocks.size());
  shares_.Unpin(format, blocks, charge, &last);
  if (!last.empty()) Free(format, last);
  return static_cast<int64_t>(last.size());
}

absl::Status BlockPool::AllocateOrReclaim(StorageFormat format, int64_t n,
                                          std::vector<BlockId>* out) {
  absl::Status status = Allocate(format, n, out);
  if (!absl::IsResourceExhausted(status) || !reclaimer_) return status;
  // Cached prefixes are a cache: they give way before a live allocation fails.
  const int64_t need = n * static_cast<int64_t>(layout(format).block_bytes);
  const int64_t room = capacity_bytes() - used_bytes();
  if (reclaimer_(need - room) <= 0) return status;
  return Allocate(format, n, out);
}

}  // namespace kvc::cachesvc
