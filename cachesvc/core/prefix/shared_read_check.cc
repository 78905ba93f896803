#include "cachesvc/core/prefix/shared_read_check.h"

#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Where a block sits in the sequence, for the message.
struct BlockPlace {
  BlockId block = 0;
  int layer = 0;
  int head = 0;
};

absl::Status Corrupt(const Sequence& seq, const BlockPlace& at, bool found_now) {
  return absl::DataLossError(
      absl::StrCat("sequence ", Quoted(seq.id()), " shares a prefix-cache block (layer ", at.layer,
                   ", kv head ", at.head,
                   ") whose bytes no longer match the checksum taken when it was "
                   "published",
                   found_now ? "" : " (found earlier)",
                   "; its KV is not served. Release the sequence and prefill it again"));
}

}  // namespace

absl::Status CheckSharedReads(const Sequence& seq, absl::Span<const int> layers,
                              const SharedReadCheck& check) {
  BlockShares& shares = seq.pool()->shares();
  const bool known_corrupt = shares.corrupt_blocks() > 0;
  if (!check.verify && !known_corrupt) return absl::OkStatus();
  if (shares.frozen_blocks() == 0) return absl::OkStatus();
  const PoolGeometry& g = seq.geometry();
  const SequenceStorage& st = seq.storage();
  std::array<std::vector<BlockPlace>, kernels::kNumStorageFormats> by_format;
  auto add_layer = [&](int layer) {
    for (int h = 0; h < g.num_kv_heads; ++h) {
      for (const Segment& s : st.lane(layer, h)) {
        for (BlockId b : s.blocks) {
          by_format[static_cast<size_t>(s.format)].push_back(BlockPlace{b, layer, h});
        }
      }
    }
  };
  if (layers.empty()) {
    for (int l = 0; l < g.num_layers; ++l) add_layer(l);
  }
  for (int l : layers) add_layer(l);

  for (size_t f = 0; f < by_format.size(); ++f) {
    const auto format = static_cast<StorageFormat>(f);
    const std::vector<BlockPlace>& places = by_format[f];
    if (places.empty()) continue;
    if (known_corrupt) {
      for (const BlockPlace& at : places) {
        if (shares.Corrupt(format, at.block)) {
          check.index->CountCorruptRead();
          return Corrupt(seq, at, /*found_now=*/false);
        }
      }
    }
    if (!check.verify) continue;
    std::vector<BlockId> blocks, which;
    blocks.reserve(places.size());
    for (const BlockPlace& at : places) blocks.push_back(at.block);
    std::vector<uint64_t> want, got;
    shares.Checksummed(format, blocks, &which, &want);
    if (which.empty()) continue;
    KVC_RETURN_IF_ERROR(BlockChecksums(seq.pool(), format, which, &got));
    std::vector<BlockId> bad;
    for (size_t i = 0; i < which.size(); ++i) {
      if (got[i] != want[i]) bad.push_back(which[i]);
    }
    if (bad.empty()) continue;
    for (BlockId b : bad) shares.MarkCorrupt(format, b);
    check.index->DropCorrupt(format, bad);
    check.index->CountCorruptRead();
    for (const BlockPlace& at : places) {
      if (at.block == bad.front()) return Corrupt(seq, at, /*found_now=*/true);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
