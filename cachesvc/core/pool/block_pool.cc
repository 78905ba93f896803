#include "cachesvc/core/pool/block_pool.h"

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

absl::Status BlockPool::AllocateOrReclaim(StorageFormat format, int64_t n, const std::string& owner,
                                          std::vector<BlockId>* out) {
  absl::Status status = AllocateFor(format, n, owner, out);
  if (!absl::IsResourceExhausted(status) || !reclaimer_) return status;
  // Cached prefixes are a cache: they give way before a live allocation fails. A pool with
  // bytes to spare can still be full for this owner (every host segment held by other owners):
  // then cached blocks free whole segments.
  const int64_t need = n * static_cast<int64_t>(layout(format).block_bytes);
  const int64_t room = capacity_bytes() - used_bytes();
  if (reclaimer_(room >= need ? need : need - room) <= 0) return status;
  return AllocateFor(format, n, owner, out);
}

}  // namespace kvc::cachesvc
