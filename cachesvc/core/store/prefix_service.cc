#include "cachesvc/core/store/prefix_service.h"

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/prefix/prefix_attach.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::Status PrefixService::Attach(Sequence& seq, int pool_index, const PrefixSpec& prefix) {
  kvc::WriterMutexLock lock(&seq.mu());
  const StorageFormat format = seq.storage().format();
  const std::vector<PrefixKey> keys =
      ChainKeys(LayoutDigest(LayoutOf(prefix, seq.scope(), format), seq.geometry()),
                prefix.token_ids, seq.geometry().block_tokens);
  std::vector<std::vector<BlockId>> attached;
  KVC_RETURN_IF_ERROR(
      parts_.prefixes[static_cast<size_t>(pool_index)]->Attach(keys, format, &attached));
  if (attached.empty()) return absl::OkStatus();
  return InstallAttachedLocked(seq, format, attached);
}

absl::StatusOr<LookupPrefixResult> PrefixService::LookupPrefix(const LookupPrefixParams& p) {
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, parts_.FindPool(p.pool));
  KVC_RETURN_IF_ERROR(ValidatePrefix(p.prefix, CompressionSpec{}));
  const PoolGeometry& g = pool->options().geometry;
  const StorageFormat format = p.format.value_or(kernels::RawFormatFor(g.dtype));
  const std::vector<PrefixKey> keys = ChainKeys(
      LayoutDigest(LayoutOf(p.prefix, p.scope, format), g), p.prefix.token_ids, g.block_tokens);
  LookupPrefixResult result;
  result.block_tokens = g.block_tokens;
  result.cached_tokens =
      parts_.prefixes[static_cast<size_t>(parts_.PoolIndex(pool))]->Lookup(keys) * g.block_tokens;
  return result;
}

absl::StatusOr<PublishPrefixResult> PrefixService::PublishPrefix(const PublishPrefixParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_.FindLive(p.scope, p.sequence_id));
  KVC_RETURN_IF_ERROR(ValidatePrefix(p.prefix, CompressionSpec{}));
  kvc::WriterMutexLock lock(&seq->mu());
  seq->AwaitNoWrites();
  if (seq->released()) {
    return absl::NotFoundError(absl::StrCat("sequence ", Quoted(p.sequence_id), " was released"));
  }
  return PublishLocked(*seq, *parts_.prefixes[static_cast<size_t>(seq->pool_index())], p.prefix);
}

}  // namespace kvc::cachesvc
