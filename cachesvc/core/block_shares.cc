#include "cachesvc/core/block_shares.h"

#include "common/check.h"

namespace kvc::cachesvc {

void BlockShares::Freeze(StorageFormat format, absl::Span<const BlockId> blocks,
                         int extra_holders) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto [it, inserted] = map.try_emplace(b);
    if (inserted) frozen_.fetch_add(1, std::memory_order_relaxed);
    it->second.holders += extra_holders;
  }
}

void BlockShares::SetChecksums(StorageFormat format, absl::Span<const BlockId> blocks,
                               absl::Span<const uint64_t> checksums) {
  KVC_CHECK(blocks.size() == checksums.size()) << "one checksum per block";
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto it = map.find(blocks[i]);
    KVC_CHECK(it != map.end()) << "block " << blocks[i] << " is checksummed but not frozen";
    it->second.has_checksum = true;
    it->second.checksum = checksums[i];
  }
}

void BlockShares::Hold(StorageFormat format, absl::Span<const BlockId> blocks) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    KVC_CHECK(it != map.end()) << "block " << b << " is shared but was never frozen";
    ++it->second.holders;
  }
}

void BlockShares::Drop(StorageFormat format, absl::Span<const BlockId> blocks,
                       std::vector<BlockId>* last) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end()) {
      last->push_back(b);  // never shared: its only holder let go
      continue;
    }
    KVC_CHECK(it->second.holders >= 1) << "block " << b << " has no holder left";
    --it->second.holders;
    if (it->second.holders == 1 && !it->second.has_checksum) {
      // Shared by a fork or a lease only, and now by one holder: nobody else reads it, so
      // its holder may write it in place again (a published block keeps its checksum and
      // stays frozen for the prefix index).
      map.erase(it);
      frozen_.fetch_sub(1, std::memory_order_relaxed);
      continue;
    }
    if (it->second.holders == 0) {
      // Back to the pool: its next owner rewrites every byte, so the mark goes with it.
      if (it->second.corrupt) corrupt_.fetch_sub(1, std::memory_order_release);
      map.erase(it);
      frozen_.fetch_sub(1, std::memory_order_relaxed);
      last->push_back(b);
    }
  }
}

bool BlockShares::Frozen(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  return shares_[static_cast<size_t>(format)].contains(block);
}

bool BlockShares::Published(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  auto it = map.find(block);
  return it != map.end() && it->second.has_checksum;
}

int64_t BlockShares::Holders(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  auto it = map.find(block);
  return it == map.end() ? 1 : it->second.holders;
}

void BlockShares::Checksummed(StorageFormat format, absl::Span<const BlockId> blocks,
                              std::vector<BlockId>* which, std::vector<uint64_t>* checksums) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end() || !it->second.has_checksum) continue;
    which->push_back(b);
    checksums->push_back(it->second.checksum);
  }
}

void BlockShares::MarkCorrupt(StorageFormat format, BlockId block) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  auto it = map.find(block);
  KVC_CHECK(it != map.end()) << "block " << block << " is marked corrupt but not frozen";
  if (it->second.corrupt) return;
  it->second.corrupt = true;
  corrupt_.fetch_add(1, std::memory_order_release);
}

bool BlockShares::Corrupt(StorageFormat format, BlockId block) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  auto it = map.find(block);
  return it != map.end() && it->second.corrupt;
}

}  // namespace kvc::cachesvc
