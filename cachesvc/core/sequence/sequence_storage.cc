#include "cachesvc/core/sequence/sequence_storage.h"

#include "common/check.h"

namespace kvc::cachesvc {

SequenceStorage::SequenceStorage(int num_layers, int num_kv_heads, StorageFormat raw,
                                 std::vector<Tier> tiers)
    : num_layers_(num_layers), num_kv_heads_(num_kv_heads), raw_(raw), tiers_(std::move(tiers)) {
  KVC_CHECK(!tiers_.empty() && tiers_.front().limit == Tier::kUnlimited);
  NoteLossy();
  lanes_.resize(static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads));
  generations_.assign(static_cast<size_t>(num_layers), 0);
  for (auto& lane : lanes_) {
    for (const Tier& t : tiers_) lane.push_back(Segment{t.format, {}, {}, {}});
  }
}

int64_t SequenceStorage::lane_tokens(int layer, int kv_head) const {
  int64_t n = 0;
  for (const Segment& s : lane(layer, kv_head)) n += s.size();
  return n;
}

void SequenceStorage::Count(const Segment& s, int64_t sign) {
  stored_token_heads_ += sign * s.size();
  blocks_by_format_[static_cast<size_t>(s.format)] += sign * static_cast<int64_t>(s.blocks.size());
}

void SequenceStorage::Replace(int lane, int tier, Segment segment) {
  Segment& slot = lanes_[static_cast<size_t>(lane)][static_cast<size_t>(tier)];
  Count(slot, -1);
  slot = std::move(segment);
  Count(slot, +1);
}

void SequenceStorage::Extend(int lane, int tier, const std::vector<BlockId>& blocks,
                             const std::vector<int32_t>& positions,
                             const std::vector<float>& scores) {
  Segment& slot = lanes_[static_cast<size_t>(lane)][static_cast<size_t>(tier)];
  Count(slot, -1);
  slot.blocks.insert(slot.blocks.end(), blocks.begin(), blocks.end());
  slot.positions.insert(slot.positions.end(), positions.begin(), positions.end());
  slot.scores.insert(slot.scores.end(), scores.begin(), scores.end());
  Count(slot, +1);
}

void SequenceStorage::SetScores(int lane, int tier, std::vector<float> scores) {
  Segment& s = lanes_[static_cast<size_t>(lane)][static_cast<size_t>(tier)];
  KVC_CHECK(scores.size() == s.positions.size()) << scores.size() << " vs " << s.positions.size();
  s.scores = std::move(scores);
}

void SequenceStorage::SetTiers(std::vector<Tier> tiers) {
  KVC_CHECK(!tiers.empty() && tiers.front().limit == Tier::kUnlimited);
  KVC_CHECK(tiers.size() >= tiers_.size()) << "tiers are never removed";
  tiers_ = std::move(tiers);
  for (auto& lane : lanes_) {
    while (lane.size() < tiers_.size())
      lane.push_back(Segment{tiers_[lane.size()].format, {}, {}, {}});
  }
  NoteLossy();
}

void SequenceStorage::NoteLossy() {
  // f32 holds every raw value exactly; any other format than the raw one may not.
  for (const Tier& t : tiers_) ever_lossy_ |= t.format != raw_ && t.format != StorageFormat::kF32;
}

std::vector<std::pair<StorageFormat, std::vector<BlockId>>> SequenceStorage::TakeAllBlocks() {
  std::array<std::vector<BlockId>, kernels::kNumStorageFormats> by_format;
  for (auto& lane : lanes_) {
    for (Segment& s : lane) {
      Count(s, -1);
      auto& to = by_format[static_cast<size_t>(s.format)];
      to.insert(to.end(), s.blocks.begin(), s.blocks.end());
      s = Segment{s.format, {}, {}, {}};
    }
  }
  BumpAllGenerations();
  std::vector<std::pair<StorageFormat, std::vector<BlockId>>> out;
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    if (!by_format[static_cast<size_t>(f)].empty()) {
      out.emplace_back(static_cast<StorageFormat>(f), std::move(by_format[static_cast<size_t>(f)]));
    }
  }
  return out;
}

}  // namespace kvc::cachesvc
