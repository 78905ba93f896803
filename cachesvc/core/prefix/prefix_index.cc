#include "cachesvc/core/prefix/prefix_index.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/op_stage.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

PrefixKey FromXxh(const XXH128_hash_t& h) { return PrefixKey{h.high64, h.low64}; }

}  // namespace

PrefixKey LayoutDigest(const PrefixLayout& layout, const PoolGeometry& g) {
  // Length-prefixed fields: no two layouts serialize alike.
  std::string s = "kvcache-prefix-v1";
  auto field = [&s](absl::string_view name, absl::string_view value) {
    absl::StrAppend(&s, "|", name, "=", value.size(), ":", value);
  };
  field("model", layout.model);
  field("scope", layout.scope);
  field("salt", layout.salt);
  field("format", kernels::StorageFormatName(layout.format));
  field("geometry",
        absl::StrCat(g.num_layers, "x", g.num_kv_heads, "x", g.head_dim, "/", g.num_query_heads,
                     "/", g.block_tokens, "/", kernels::DTypeName(g.dtype)));
  field("rope", g.rope.enabled ? absl::StrCat(g.rope.theta, "/", g.rope.rotary_dim, "/",
                                              static_cast<int>(g.rope.style))
                               : "none");
  return FromXxh(XXH3_128bits(s.data(), s.size()));
}

std::vector<PrefixKey> ChainKeys(const PrefixKey& digest, absl::Span<const int32_t> token_ids,
                                 int block_tokens) {
  const size_t n = token_ids.size() / static_cast<size_t>(block_tokens);
  std::vector<PrefixKey> keys;
  keys.reserve(n);
  PrefixKey parent = digest;
  std::vector<unsigned char> buf(16 + sizeof(int32_t) * static_cast<size_t>(block_tokens));
  for (size_t b = 0; b < n; ++b) {
    // Explicit little-endian bytes: keys must not depend on the host.
    for (int i = 0; i < 8; ++i) {
      buf[static_cast<size_t>(i)] = static_cast<unsigned char>(parent.high >> (8 * i));
      buf[static_cast<size_t>(8 + i)] = static_cast<unsigned char>(parent.low >> (8 * i));
    }
    for (int t = 0; t < block_tokens; ++t) {
      const auto v = static_cast<uint32_t>(
          token_ids[b * static_cast<size_t>(block_tokens) + static_cast<size_t>(t)]);
      for (int i = 0; i < 4; ++i) {
        buf[16 + 4 * static_cast<size_t>(t) + static_cast<size_t>(i)] =
            static_cast<unsigned char>(v >> (8 * i));
      }
    }
    parent = FromXxh(XXH3_128bits(buf.data(), buf.size()));
    keys.push_back(parent);
  }
  return keys;
}

absl::Status BlockChecksums(BlockPool* pool, StorageFormat format, absl::Span<const BlockId> blocks,
                            std::vector<uint64_t>* out) {
  out->assign(blocks.size(), 0);
  if (blocks.empty()) return absl::OkStatus();
  OpStage stage(pool);
  kernels::ChecksumBlocksArgs a;
  a.arena = pool->arena(format);
  a.num_blocks = static_cast<int32_t>(blocks.size());
  a.blocks = stage.In(blocks.data(), blocks.size());
  a.checksums = stage.Out(out->data(), out->size());
  KVC_RETURN_IF_ERROR(stage.Launch("ChecksumBlocks", [&](kernels::StreamHandle st) {
    return pool->backend()->ChecksumBlocks(a, st);
  }));
  return stage.Finish();
}

PrefixIndex::PrefixIndex(BlockPool* pool) : pool_(pool) {}

PrefixIndex::~PrefixIndex() {
  kvc::MutexLock lock(&mu_);
  while (!entries_.empty()) EraseLocked(entries_.begin());
}

int64_t PrefixIndex::EntryBytes(const Entry& e) const {
  return static_cast<int64_t>(e.blocks.size()) *
         static_cast<int64_t>(pool_->layout(e.format).block_bytes);
}

void PrefixIndex::EraseLocked(absl::flat_hash_map<PrefixKey, Entry>::iterator it) {
  Entry& e = it->second;
  if (e.has_parent) {
    auto parent = entries_.find(e.parent);
    if (parent != entries_.end()) --parent->second.children;
  }
  cached_bytes_ -= EntryBytes(e);
  pool_->Drop(e.format, e.blocks, Holder::kIndex);
  entries_.erase(it);
}

bool PrefixIndex::UnusedLocked(const Entry& e) const {
  if (e.children > 0) return false;
  for (BlockId b : e.blocks) {
    if (pool_->shares().Holders(e.format, b) > 1) return false;
  }
  return true;
}

void PrefixIndex::RememberEvictedLocked(const PrefixKey& key) {
  if (!evicted_keys_.insert(key).second) return;
  evicted_order_.push_back(key);
  if (evicted_order_.size() > kRememberEvicted) {
    evicted_keys_.erase(evicted_order_.front());
    evicted_order_.pop_front();
  }
}

void PrefixIndex::CountMissLocked(absl::Span<const PrefixKey> keys) {
  if (!keys.empty() && evicted_keys_.contains(keys[0])) {
    evicted_misses_.fetch_add(1, std::memory_order_relaxed);
  }
}

int64_t PrefixIndex::Lookup(absl::Span<const PrefixKey> keys) {
  kvc::MutexLock lock(&mu_);
  size_t n = 0;
  while (n < keys.size() && entries_.contains(keys[n])) ++n;
  lookups_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) {
    hits_.fetch_add(1, std::memory_order_relaxed);
  } else {
    CountMissLocked(keys);
  }
  const int64_t bt = pool_->options().geometry.block_tokens;
  lookup_tokens_.fetch_add(static_cast<int64_t>(keys.size()) * bt, std::memory_order_relaxed);
  hit_tokens_.fetch_add(static_cast<int64_t>(n) * bt, std::memory_order_relaxed);
  return static_cast<int64_t>(n);
}

absl::Status PrefixIndex::Attach(absl::Span<const PrefixKey> keys, StorageFormat format,
                                 std::vector<std::vector<BlockId>>* attached) {
  attached->clear();
  std::vector<std::vector<uint64_t>> expected;
  {
    kvc::MutexLock lock(&mu_);
    ++clock_;
    for (const PrefixKey& key : keys) {
      auto it = entries_.find(key);
      if (it == entries_.end() || it->second.format != format) break;
      it->second.last_used = clock_;
      pool_->shares().Hold(format, it->second.blocks);
      attached->push_back(it->second.blocks);
      expected.push_back(it->second.checksums);
    }
    if (attached->empty()) CountMissLocked(keys);
  }
  // Verify outside the index lock (reading blocks may take a while), all blocks in one op;
  // the holds keep the blocks from going back to the pool meanwhile, and frozen blocks are
  // never rewritten.
  std::vector<BlockId> all;
  for (const auto& blocks : *attached) all.insert(all.end(), blocks.begin(), blocks.end());
  std::vector<uint64_t> sums;
  absl::Status read = BlockChecksums(pool_, format, all, &sums);
  size_t good = 0;
  if (read.ok()) {
    for (size_t at = 0; good < attached->size(); ++good) {
      const std::vector<uint64_t>& want = expected[good];
      if (!std::equal(want.begin(), want.end(), sums.begin() + static_cast<std::ptrdiff_t>(at))) {
        break;
      }
      at += want.size();
    }
  }
  if (good < attached->size()) {
    if (read.ok()) {
      checksum_misses_.fetch_add(1, std::memory_order_relaxed);
      kvc::MutexLock lock(&mu_);
      auto it = entries_.find(keys[good]);
      if (it != entries_.end() && it->second.blocks == (*attached)[good]) EraseLocked(it);
    }
    for (size_t i = good; i < attached->size(); ++i) {
      pool_->Drop(format, (*attached)[i], Holder::kSequence);
    }
    attached->resize(good);
  }
  const int64_t bt = pool_->options().geometry.block_tokens;
  lookups_.fetch_add(1, std::memory_order_relaxed);
  if (good > 0) hits_.fetch_add(1, std::memory_order_relaxed);
  lookup_tokens_.fetch_add(static_cast<int64_t>(keys.size()) * bt, std::memory_order_relaxed);
  hit_tokens_.fetch_add(static_cast<int64_t>(good) * bt, std::memory_order_relaxed);
  attached_tokens_.fetch_add(static_cast<int64_t>(good) * bt, std::memory_order_relaxed);
  if (!read.ok()) {
    for (const auto& blocks : *attached) pool_->Drop(format, blocks, Holder::kSequence);
    attached->clear();
    return read;
  }
  return absl::OkStatus();
}

std::vector<size_t> PrefixIndex::Missing(absl::Span<const PrefixKey> keys) const {
  kvc::MutexLock lock(&mu_);
  std::vector<size_t> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!entries_.contains(keys[i])) missing.push_back(i);
  }
  return missing;
}

int64_t PrefixIndex::Publish(absl::Span<const PrefixKey> keys, absl::Span<const size_t> which,
                             StorageFormat format, const std::vector<std::vector<BlockId>>& blocks,
                             const std::vector<std::vector<uint64_t>>& checksums) {
  KVC_CHECK(blocks.size() == which.size() && checksums.size() == which.size());
  kvc::MutexLock lock(&mu_);
  ++clock_;
  int64_t added = 0;
  for (size_t k = 0; k < which.size(); ++k) {
    const size_t i = which[k];
    Entry e;
    e.has_parent = i > 0;
    if (e.has_parent) e.parent = keys[i - 1];
    e.format = format;
    e.blocks = blocks[k];
    e.checksums = checksums[k];
    e.last_used = clock_;
    auto [it, inserted] = entries_.try_emplace(keys[i], std::move(e));
    if (!inserted) continue;  // published by another sequence meanwhile
    // The index becomes a holder; the sequence that wrote the blocks stays one.
    pool_->shares().Freeze(format, it->second.blocks, Holder::kIndex);
    pool_->shares().SetChecksums(format, it->second.blocks, it->second.checksums);
    cached_bytes_ += EntryBytes(it->second);
    if (it->second.has_parent) {
      auto parent = entries_.find(it->second.parent);
      if (parent != entries_.end()) ++parent->second.children;
    }
    ++added;
  }
  published_.fetch_add(added, std::memory_order_relaxed);
  return added;
}

int64_t PrefixIndex::DropCorrupt(StorageFormat format, absl::Span<const BlockId> blocks) {
  const absl::flat_hash_set<BlockId> bad(blocks.begin(), blocks.end());
  kvc::MutexLock lock(&mu_);
  std::vector<PrefixKey> doomed;  // a rare event: a scan of the index is fine
  for (const auto& [key, e] : entries_) {
    if (e.format != format) continue;
    for (BlockId b : e.blocks) {
      if (bad.contains(b)) {
        doomed.push_back(key);
        break;
      }
    }
  }
  for (const PrefixKey& key : doomed) EraseLocked(entries_.find(key));
  checksum_misses_.fetch_add(static_cast<int64_t>(doomed.size()), std::memory_order_relaxed);
  return static_cast<int64_t>(doomed.size());
}

int64_t PrefixIndex::Reclaim(int64_t bytes) {
  kvc::MutexLock lock(&mu_);
  int64_t freed = 0;
  while (freed < bytes) {
    // The unused leaves, oldest first; evicting one may turn its parent into a leaf.
    std::vector<std::pair<uint64_t, PrefixKey>> unused;
    for (const auto& [key, e] : entries_) {
      if (UnusedLocked(e)) unused.emplace_back(e.last_used, key);
    }
    if (unused.empty()) break;
    std::sort(unused.begin(), unused.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [used, key] : unused) {
      if (freed >= bytes) break;
      auto it = entries_.find(key);
      freed += EntryBytes(it->second);
      EraseLocked(it);
      RememberEvictedLocked(key);
      evicted_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return freed;
}

PrefixStats PrefixIndex::stats() const {
  PrefixStats s;
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.hits = hits_.load(std::memory_order_relaxed);
  s.lookup_tokens = lookup_tokens_.load(std::memory_order_relaxed);
  s.hit_tokens = hit_tokens_.load(std::memory_order_relaxed);
  s.attached_tokens = attached_tokens_.load(std::memory_order_relaxed);
  s.checksum_misses = checksum_misses_.load(std::memory_order_relaxed);
  s.corrupt_reads = corrupt_reads_.load(std::memory_order_relaxed);
  s.evicted_misses = evicted_misses_.load(std::memory_order_relaxed);
  s.published_entries = published_.load(std::memory_order_relaxed);
  s.evicted_entries = evicted_.load(std::memory_order_relaxed);
  kvc::MutexLock lock(&mu_);
  s.entries = static_cast<int64_t>(entries_.size());
  s.cached_bytes = cached_bytes_;
  for (const auto& [key, e] : entries_) {
    bool unused = true;
    for (BlockId b : e.blocks) unused = unused && pool_->shares().Holders(e.format, b) == 1;
    if (unused) s.unreferenced_bytes += EntryBytes(e);
  }
  return s;
}

}  // namespace kvc::cachesvc
