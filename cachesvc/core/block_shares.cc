#include "cachesvc/core/block_shares.h"

#include "common/check.h"

namespace kvc::cachesvc {

void BlockShares::Freeze(StorageFormat format, absl::Span<const BlockId> blocks,
                         int extra_holders) {
  kvc::MutexLock lock(&mu_);
  auto& map = holders_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto [it, inserted] = map.try_emplace(b, 1);
    if (inserted) frozen_.fetch_add(1, std::memory_order_relaxed);
    it->second += extra_holders;
  }
}

void BlockShares::Hold(StorageFormat format, absl::Span<const BlockId> blocks) {
  kvc::MutexLock lock(&mu_);
  auto& map = holders_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    KVC_CHECK(it != map.end()) << "block " << b << " is shared but was never frozen";
    ++it->second;
  }
}

void BlockShares::Drop(StorageFormat format, absl::Span<const BlockId> blocks,
                       std::vector<BlockId>* last) {
  kvc::MutexLock lock(&mu_);
  auto& map = holders_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end()) {
      last->push_back(b);  // never shared: its only holder let go
      continue;
    }
    KVC_CHECK(it->second >= 1) << "block " << b << " has no holder left";
    if (--it->second == 0) {
      map.erase(it);
      frozen_.fetch_sub(1, std::memory_order_relaxed);
      last->push_back(b);
    }
  }
}

bool BlockShares::Frozen(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  return holders_[static_cast<size_t>(format)].contains(block);
}

int64_t BlockShares::Holders(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = holders_[static_cast<size_t>(format)];
  auto it = map.find(block);
  return it == map.end() ? 1 : it->second;
}

}  // namespace kvc::cachesvc
