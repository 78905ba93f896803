// KvStore's prefix cache operations (prefix_index.h, prefix_attach.h).
#include "cachesvc/core/kv_store.h"
#include "cachesvc/core/prefix_attach.h"
#include "cachesvc/core/quote.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

int KvStore::PoolIndex(const BlockPool* pool) const {
  int index = 0;
  while (pools_[static_cast<size_t>(index)].get() != pool) ++index;
  return index;
}

absl::Status KvStore::AttachPrefix(Sequence& seq, int pool_index, const PrefixSpec& prefix) {
  kvc::WriterMutexLock lock(&seq.mu());
  const StorageFormat format = seq.storage().format();
  const std::vector<PrefixKey> keys =
      ChainKeys(LayoutDigest(LayoutOf(prefix, seq.scope(), format), seq.geometry()),
                prefix.token_ids, seq.geometry().block_tokens);
  std::vector<std::vector<BlockId>> attached;
  KVC_RETURN_IF_ERROR(prefixes_[static_cast<size_t>(pool_index)]->Attach(keys, format, &attached));
  if (attached.empty()) return absl::OkStatus();
  return InstallAttachedLocked(seq, format, attached);
}

absl::StatusOr<LookupPrefixResult> KvStore::LookupPrefix(const LookupPrefixParams& p) {
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, FindPool(p.pool));
  KVC_RETURN_IF_ERROR(ValidatePrefix(p.prefix, CompressionSpec{}));
  const PoolGeometry& g = pool->options().geometry;
  const StorageFormat format = p.format.value_or(kernels::RawFormatFor(g.dtype));
  const std::vector<PrefixKey> keys = ChainKeys(
      LayoutDigest(LayoutOf(p.prefix, p.scope, format), g), p.prefix.token_ids, g.block_tokens);
  LookupPrefixResult result;
  result.block_tokens = g.block_tokens;
  result.cached_tokens =
      prefixes_[static_cast<size_t>(PoolIndex(pool))]->Lookup(keys) * g.block_tokens;
  return result;
}

absl::StatusOr<PublishPrefixResult> KvStore::PublishPrefix(const PublishPrefixParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, FindLive(p.scope, p.sequence_id));
  KVC_RETURN_IF_ERROR(ValidatePrefix(p.prefix, CompressionSpec{}));
  kvc::WriterMutexLock lock(&seq->mu());
  seq->AwaitNoWrites();
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence ", Quoted(p.sequence_id), " was released"));
  }
  return PublishLocked(*seq, *prefixes_[static_cast<size_t>(seq->pool_index())], p.prefix);
}

absl::StatusOr<PrefixStats> KvStore::PrefixCacheStats(const std::string& pool) const {
  PrefixStats sum;
  bool found = pool.empty();
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (!pool.empty() && pools_[i]->options().name != pool) continue;
    found = true;
    const PrefixStats s = prefixes_[i]->stats();
    sum.lookups += s.lookups;
    sum.hits += s.hits;
    sum.lookup_tokens += s.lookup_tokens;
    sum.hit_tokens += s.hit_tokens;
    sum.attached_tokens += s.attached_tokens;
    sum.checksum_misses += s.checksum_misses;
    sum.corrupt_reads += s.corrupt_reads;
    sum.evicted_misses += s.evicted_misses;
    sum.published_entries += s.published_entries;
    sum.evicted_entries += s.evicted_entries;
    sum.entries += s.entries;
    sum.cached_bytes += s.cached_bytes;
    sum.unreferenced_bytes += s.unreferenced_bytes;
  }
  if (!found) return FindPool(pool).status();
  return sum;
}

}  // namespace kvc::cachesvc
