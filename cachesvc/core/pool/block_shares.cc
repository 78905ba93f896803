#include "cachesvc/core/pool/block_shares.h"

#include <algorithm>

#include "cachesvc/core/tenant/tenant_account.h"
#include "common/check.h"

namespace kvc::cachesvc {

void BlockShares::Recharge(const std::optional<LeaseCharge>& before, const LeaseCharge* after) {
  if (before.has_value() && after != nullptr && before->account == after->account) return;
  if (before.has_value()) {
    lease_only_bytes_.fetch_sub(before->block_bytes, std::memory_order_relaxed);
    if (before->account != nullptr)
      before->account->AddLeaseOnly(before->pool, -before->block_bytes);
  }
  if (after != nullptr) {
    lease_only_bytes_.fetch_add(after->block_bytes, std::memory_order_relaxed);
    if (after->account != nullptr) after->account->AddLeaseOnly(after->pool, after->block_bytes);
  }
}

namespace {

std::optional<LeaseCharge> Copy(const LeaseCharge* charge) {
  return charge == nullptr ? std::nullopt : std::optional<LeaseCharge>(*charge);
}

}  // namespace

void BlockShares::Freeze(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto [it, inserted] = map.try_emplace(b);
    if (inserted) frozen_.fetch_add(1, std::memory_order_relaxed);
    Share& s = it->second;
    // A sequence holds every block it freezes, so no block here is lease-only before or after.
    KVC_CHECK(s.sequences() >= 1) << "block " << b << " is frozen by no sequence's hold";
    ++s.holders;
    if (holder == Holder::kIndex) {
      KVC_CHECK(!s.indexed) << "block " << b << " is in two prefix entries";
      s.indexed = true;
    }
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

void BlockShares::Pin(StorageFormat format, absl::Span<const BlockId> blocks,
                      const LeaseCharge& charge) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto [it, inserted] = map.try_emplace(b);
    if (inserted) frozen_.fetch_add(1, std::memory_order_relaxed);
    Share& s = it->second;
    KVC_CHECK(s.sequences() >= 1) << "block " << b << " is leased from no sequence";
    if (s.leases == 0) pinned_.fetch_add(1, std::memory_order_release);
    ++s.holders;
    ++s.leases;
    auto lessee = std::find_if(s.lessees.begin(), s.lessees.end(),
                               [&](const Lessee& l) { return l.charge.account == charge.account; });
    if (lessee == s.lessees.end()) {
      s.lessees.push_back(Lessee{charge, 1});
    } else {
      ++lessee->leases;
    }
  }
}

void BlockShares::Unpin(StorageFormat format, absl::Span<const BlockId> blocks,
                        const LeaseCharge& charge, std::vector<BlockId>* last) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    KVC_CHECK(it != map.end()) << "leased block " << b << " is not frozen";
    Share& s = it->second;
    auto lessee = std::find_if(s.lessees.begin(), s.lessees.end(),
                               [&](const Lessee& l) { return l.charge.account == charge.account; });
    KVC_CHECK(lessee != s.lessees.end() && s.leases >= 1) << "block " << b << " has no such lease";
    const std::optional<LeaseCharge> before = Copy(s.payer());
    --s.holders;
    --s.leases;
    if (--lessee->leases == 0) s.lessees.erase(lessee);
    if (s.leases == 0) pinned_.fetch_sub(1, std::memory_order_release);
    Recharge(before, s.payer());
    ReleaseIfDone(map, it, b, last);
  }
}

void BlockShares::Hold(StorageFormat format, absl::Span<const BlockId> blocks) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    KVC_CHECK(it != map.end()) << "block " << b << " is shared but was never frozen";
    const std::optional<LeaseCharge> before = Copy(it->second.payer());
    ++it->second.holders;
    Recharge(before, it->second.payer());
  }
}

void BlockShares::Drop(StorageFormat format, absl::Span<const BlockId> blocks, Holder holder,
                       std::vector<BlockId>* last) {
  kvc::MutexLock lock(&mu_);
  auto& map = shares_[static_cast<size_t>(format)];
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end()) {
      KVC_CHECK(holder == Holder::kSequence) << "block " << b << " was never published";
      last->push_back(b);  // never shared: its only holder let go
      continue;
    }
    Share& s = it->second;
    const std::optional<LeaseCharge> before = Copy(s.payer());
    if (holder == Holder::kIndex) {
      KVC_CHECK(s.indexed) << "block " << b << " is not in the prefix index";
      s.indexed = false;
    } else {
      KVC_CHECK(s.sequences() >= 1) << "block " << b << " has no sequence holder left";
    }
    --s.holders;
    Recharge(before, s.payer());
    ReleaseIfDone(map, it, b, last);
  }
}

void BlockShares::ReleaseIfDone(absl::flat_hash_map<BlockId, Share>& map,
                                absl::flat_hash_map<BlockId, Share>::iterator it, BlockId block,
                                std::vector<BlockId>* last) {
  const Share& s = it->second;
  if (s.holders == 1 && s.sequences() == 1 && !s.has_checksum) {
    // Shared by a fork or a lease only, and now held by one sequence: nobody else reads it, so
    // its holder may write it in place again (a published block keeps its checksum and stays
    // frozen for the prefix index).
    map.erase(it);
    frozen_.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  if (s.holders == 0) {
    // Back to the pool: its next owner rewrites every byte, so the mark goes with it.
    if (s.corrupt) corrupt_.fetch_sub(1, std::memory_order_release);
    map.erase(it);
    frozen_.fetch_sub(1, std::memory_order_relaxed);
    last->push_back(block);
  }
}

int64_t BlockShares::LeaseOnlyIfDropped(StorageFormat format, absl::Span<const BlockId> blocks,
                                        const TenantAccount* account) const {
  if (pinned_blocks() == 0) return 0;
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  int64_t bytes = 0;
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end()) continue;
    const Share& s = it->second;
    if (s.sequences() == 1 && !s.lessees.empty() && s.lessees.front().charge.account == account) {
      bytes += s.lessees.front().charge.block_bytes;
    }
  }
  return bytes;
}

int64_t BlockShares::LeaseOnlyBytes(StorageFormat format, absl::Span<const BlockId> blocks) const {
  kvc::MutexLock lock(&mu_);
  const auto& map = shares_[static_cast<size_t>(format)];
  int64_t bytes = 0;
  for (BlockId b : blocks) {
    auto it = map.find(b);
    if (it == map.end()) continue;
    if (const LeaseCharge* payer = it->second.payer()) bytes += payer->block_bytes;
  }
  return bytes;
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
