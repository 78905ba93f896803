#include "cachesvc/core/prefix/prefix_attach.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::Status ValidatePrefix(const PrefixSpec& prefix, const CompressionSpec& policy) {
  if (prefix.model.empty() || prefix.model.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix.model is ", prefix.model.size(),
        " bytes; name the model (1-128 bytes): cached KV is only reused for the same model"));
  }
  if (prefix.salt.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix.salt is ", prefix.salt.size(), " bytes; at most 128 are allowed"));
  }
  if (static_cast<int64_t>(prefix.token_ids.size()) > kMaxPrefixTokens) {
    return absl::InvalidArgumentError(absl::StrCat("prefix.token_ids has ", prefix.token_ids.size(),
                                                   " ids; at most ", kMaxPrefixTokens,
                                                   " are allowed"));
  }
  for (size_t i = 0; i < prefix.token_ids.size(); ++i) {
    if (prefix.token_ids[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("prefix.token_ids[", i, "] is ",
                                                     prefix.token_ids[i], "; token ids are >= 0"));
    }
  }
  if (policy.residual_tokens > 0) {
    return absl::FailedPreconditionError(
        "prefix caching needs a sequence without a raw residual window (policy "
        "residual_tokens > 0 keeps its newest tokens in another tier); drop the residual or "
        "the prefix");
  }
  return absl::OkStatus();
}

PrefixLayout LayoutOf(const PrefixSpec& prefix, const TenantScope& scope, StorageFormat format) {
  return PrefixLayout{prefix.model, scope.tenant(), prefix.salt, format};
}

absl::Status InstallAttachedLocked(Sequence& seq, StorageFormat format,
                                   const std::vector<std::vector<BlockId>>& attached) {
  SequenceStorage& st = seq.storage();
  const int bt = seq.geometry().block_tokens;
  const int lanes = st.num_layers() * st.num_kv_heads();
  KVC_CHECK(st.stored_token_heads() == 0 && st.format() == format && st.tiers().size() == 1);
  const int64_t bytes = static_cast<int64_t>(attached.size()) * lanes *
                        static_cast<int64_t>(seq.pool()->layout(format).block_bytes);
  if (absl::Status quota =
          seq.account()->Reserve(seq.pool_index(), seq.pool()->options().name, bytes);
      !quota.ok()) {
    for (const auto& blocks : attached) seq.pool()->Drop(format, blocks, Holder::kSequence);
    return quota;
  }
  const int64_t tokens = static_cast<int64_t>(attached.size()) * bt;
  std::vector<int32_t> positions(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int lane = 0; lane < lanes; ++lane) {
    Segment s;
    s.format = format;
    for (const auto& blocks : attached) s.blocks.push_back(blocks[static_cast<size_t>(lane)]);
    s.positions = positions;
    s.scores.assign(static_cast<size_t>(tokens), 0.0f);
    st.Replace(lane, 0, std::move(s));
  }
  for (int l = 0; l < st.num_layers(); ++l) seq.set_layer_tokens(l, tokens);
  seq.set_attached_tokens(tokens);
  seq.SyncUsage();
  return absl::OkStatus();
}

void DropAttachedLocked(Sequence& seq) {
  int64_t bytes = 0;
  for (auto& [format, blocks] : seq.storage().TakeAllBlocks()) {
    seq.pool()->Drop(format, blocks, Holder::kSequence);
    bytes += static_cast<int64_t>(blocks.size()) *
             static_cast<int64_t>(seq.pool()->layout(format).block_bytes);
  }
  for (int l = 0; l < seq.storage().num_layers(); ++l) seq.set_layer_tokens(l, 0);
  seq.SyncUsage(/*gone=*/true);
  seq.account()->Add(seq.pool_index(), -bytes);
}

absl::StatusOr<PublishPrefixResult> PublishLocked(Sequence& seq, PrefixIndex& index,
                                                  const PrefixSpec& prefix) {
  SequenceStorage& st = seq.storage();
  if (st.tiers().size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", Quoted(seq.id()),
                     " keeps a raw residual window; only sequences without one publish "
                     "prefixes"));
  }
  const int bt = seq.geometry().block_tokens;
  const int lanes = st.num_layers() * st.num_kv_heads();
  // Whole blocks every layer has and the caller named.
  int64_t n =
      std::min<int64_t>(seq.visible_tokens(), static_cast<int64_t>(prefix.token_ids.size())) / bt *
      bt;
  // ... held exactly as appended by every lane: stored index i is position i.
  for (int lane = 0; lane < lanes && n > 0; ++lane) {
    const Segment& s = st.lane(lane)[0];
    int64_t clean = 0;
    const int64_t limit = std::min(n, s.size());
    while (clean < limit && s.positions[static_cast<size_t>(clean)] == clean) ++clean;
    n = std::min(n, clean / bt * bt);
  }
  PublishPrefixResult result;
  result.published_tokens = n;
  if (n == 0) return result;
  const StorageFormat format = st.format();
  const std::vector<PrefixKey> keys =
      ChainKeys(LayoutDigest(LayoutOf(prefix, seq.scope(), format), seq.geometry()),
                absl::MakeConstSpan(prefix.token_ids.data(), static_cast<size_t>(n)), bt);
  std::vector<size_t> missing = index.Missing(keys);
  std::vector<std::vector<BlockId>> blocks;
  for (size_t k = 0; k < missing.size(); ++k) {
    std::vector<BlockId> entry;
    bool published = false;
    for (int lane = 0; lane < lanes; ++lane) {
      entry.push_back(st.lane(lane)[0].blocks[missing[k]]);
      published = published || seq.pool()->shares().Published(format, entry.back());
    }
    // A block is in one entry at most: a published block under a key that is not cached came
    // from another prefix (the caller's token ids are not the ones it attached with) or from
    // an entry dropped as corrupt. Publish nothing from there on. Blocks a fork froze were
    // never published: they are immutable like any published block, so they may be.
    if (published) {
      result.published_tokens = static_cast<int64_t>(missing[k]) * bt;
      missing.resize(k);
      break;
    }
    blocks.push_back(std::move(entry));
  }
  // Every new entry's blocks checksummed in one op.
  std::vector<BlockId> all;
  for (const auto& entry : blocks) all.insert(all.end(), entry.begin(), entry.end());
  std::vector<uint64_t> sums;
  KVC_RETURN_IF_ERROR(BlockChecksums(seq.pool(), format, all, &sums));
  std::vector<std::vector<uint64_t>> checksums(missing.size());
  for (size_t k = 0; k < missing.size(); ++k) {
    const auto first = sums.begin() + static_cast<std::ptrdiff_t>(k * static_cast<size_t>(lanes));
    checksums[k].assign(first, first + lanes);
  }
  result.new_tokens = index.Publish(keys, missing, format, blocks, checksums) * bt;
  return result;
}

}  // namespace kvc::cachesvc
