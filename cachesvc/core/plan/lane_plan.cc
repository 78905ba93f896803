#include "cachesvc/core/plan/lane_plan.h"

#include <algorithm>

#include "common/check.h"

namespace kvc::cachesvc {
namespace {

// A token of the new state and where it is now.
struct Candidate {
  bool incoming = false;
  int tier = 0;       // old tier (stored tokens)
  int64_t index = 0;  // stored index in that tier, or incoming row
  int32_t position = 0;
  float score = 0.0f;
  int32_t delta = 0;
};

bool Kept(const std::vector<std::vector<uint8_t>>& keep, int tier, int64_t i) {
  if (static_cast<size_t>(tier) >= keep.size() || keep[static_cast<size_t>(tier)].empty()) {
    return true;
  }
  return keep[static_cast<size_t>(tier)][static_cast<size_t>(i)] != 0;
}

float ScoreOf(const LaneChange& c, const Segment& s, int tier, int64_t i) {
  if (static_cast<size_t>(tier) < c.scores.size() && !c.scores[static_cast<size_t>(tier)].empty()) {
    return c.scores[static_cast<size_t>(tier)][static_cast<size_t>(i)];
  }
  return s.scores[static_cast<size_t>(i)];
}

int32_t DeltaOf(const std::vector<std::vector<int32_t>>& delta, int tier, int64_t i) {
  if (static_cast<size_t>(tier) >= delta.size() || delta[static_cast<size_t>(tier)].empty()) {
    return 0;
  }
  return delta[static_cast<size_t>(tier)][static_cast<size_t>(i)];
}

// The old tier whose blocks new tier t keeps: one that enters t in the same format.
int CarriedTier(const LaneChange& c, int t) {
  for (int j = 0; j < static_cast<int>(c.old->size()); ++j) {
    const int to = c.entry.empty() ? j : c.entry[static_cast<size_t>(j)];
    if (to == t &&
        (*c.old)[static_cast<size_t>(j)].format == c.tiers[static_cast<size_t>(t)].format) {
      return j;
    }
  }
  return -1;
}

template <typename PerTier>
bool Empty(const PerTier& per_tier, int j) {
  return static_cast<size_t>(j) >= per_tier.size() || per_tier[static_cast<size_t>(j)].empty();
}

// True when new tier t keeps every token of the same old tier as it is: nothing dropped,
// re-rotated or re-scored, nothing can overflow out of it (unlimited), same index.
bool Untouched(const LaneChange& c, int t) {
  const int j = CarriedTier(c, t);
  return j == t && c.entry.empty() && c.tiers[static_cast<size_t>(t)].limit == Tier::kUnlimited &&
         Empty(c.keep, j) && Empty(c.delta, j) && Empty(c.scores, j);
}

// Splits the kept tokens over the new tiers: newest tier first, each keeps its newest
// `limit` candidates and passes the older ones on to the next older tier. The tokens of an
// untouched tier are left out: they stay where they are.
std::vector<std::vector<Candidate>> Assign(const LaneChange& c) {
  const std::vector<Segment>& old = *c.old;
  const int num_tiers = static_cast<int>(c.tiers.size());
  std::vector<std::vector<Candidate>> entering(static_cast<size_t>(num_tiers));
  // An append plans per token: growing these vectors one push at a time was a visible part of
  // a 256-token Append's cost.
  entering[static_cast<size_t>(num_tiers - 1)].reserve(c.incoming_positions.size());
  for (int j = 0; j < static_cast<int>(old.size()); ++j) {
    const int to = c.entry.empty() ? j : c.entry[static_cast<size_t>(j)];
    KVC_CHECK(to >= 0 && to < num_tiers) << "old tier " << j << " enters tier " << to;
    if (Untouched(c, to)) continue;
    const Segment& s = old[static_cast<size_t>(j)];
    for (int64_t i = 0; i < s.size(); ++i) {
      if (!Kept(c.keep, j, i)) continue;
      entering[static_cast<size_t>(to)].push_back(
          Candidate{false, j, i, s.positions[static_cast<size_t>(i)], ScoreOf(c, s, j, i),
                    DeltaOf(c.delta, j, i)});
    }
  }
  for (size_t r = 0; r < c.incoming_positions.size(); ++r) {
    if (!c.incoming_keep.empty() && c.incoming_keep[r] == 0) continue;
    entering[static_cast<size_t>(num_tiers - 1)].push_back(
        Candidate{true, 0, static_cast<int64_t>(r), c.incoming_positions[r], 0.0f,
                  c.incoming_delta.empty() ? 0 : c.incoming_delta[r]});
  }
  std::vector<std::vector<Candidate>> assigned(static_cast<size_t>(num_tiers));
  std::vector<Candidate> overflow;
  for (int t = num_tiers - 1; t >= 0; --t) {
    std::vector<Candidate>& mine = assigned[static_cast<size_t>(t)];
    mine = std::move(entering[static_cast<size_t>(t)]);
    mine.insert(mine.end(), overflow.begin(), overflow.end());
    overflow.clear();
    const auto by_position = [](const Candidate& a, const Candidate& b) {
      return a.position < b.position;
    };
    if (!std::is_sorted(mine.begin(), mine.end(), by_position)) {
      std::stable_sort(mine.begin(), mine.end(), by_position);
    }
    const int64_t limit = c.tiers[static_cast<size_t>(t)].limit;
    if (limit != Tier::kUnlimited && static_cast<int64_t>(mine.size()) > limit) {
      KVC_CHECK(t > 0) << "the oldest tier must be unlimited";
      const auto cut = mine.begin() + static_cast<std::ptrdiff_t>(mine.size() - limit);
      overflow.assign(mine.begin(), cut);
      mine.erase(mine.begin(), cut);
    }
  }
  return assigned;
}

class SegmentPlanner {
 public:
  SegmentPlanner(const LaneChange& c, int t, int block_tokens, std::vector<Candidate> tokens)
      : c_(c), bt_(block_tokens), tokens_(std::move(tokens)) {
    plan_.tier = c.tiers[static_cast<size_t>(t)];
    plan_.carried = CarriedTier(c, t);
    in_place_ = t == 0 && c.tier0_in_place;
    if (plan_.carried >= 0) old_ = &(*c.old)[static_cast<size_t>(plan_.carried)];
  }

  SegmentPlan Plan(bool* rewrites);
  // An untouched tier: the candidates (all fillers) go after its tokens.
  SegmentPlan Extend();

 private:
  void Fill(const Candidate& tok, const RowRef& dst);
  void Place();
  void ChooseBlocks();
  // The token that ends at stored index i.
  const Candidate& TokenAt(int64_t i) const {
    return tokens_[static_cast<size_t>(
        owner_[static_cast<size_t>(final_at_[static_cast<size_t>(i)])])];
  }
  // Row of extended index e (old slots, then the filler slots after them).
  RowRef Extended(int64_t e) const {
    const int64_t b = e / bt_;
    RowRef r;
    r.slot = static_cast<int32_t>(e % bt_);
    if (b < old_blocks_) {
      r.block = BlockRef{old_->blocks[static_cast<size_t>(b)], false};
    } else {
      r.block = BlockRef{static_cast<int32_t>(b - old_blocks_), true};
    }
    return r;
  }

  const LaneChange& c_;
  const int bt_;
  std::vector<Candidate> tokens_;
  const Segment* old_ = nullptr;
  bool in_place_ = false;
  int64_t old_blocks_ = 0;
  SegmentPlan plan_;
  // Placement (Plan only): old size, new size, old size + fillers; per token its extended
  // index; per extended index its token (-1 = none); per final index the extended index it
  // comes from; per final block whether it is copied.
  int64_t n_ = 0, m_ = 0, extended_ = 0;
  std::vector<int64_t> where_, owner_, final_at_;
  std::vector<int64_t> final_of_;  // per extended index: the final index of its token, or -1
  std::vector<uint8_t> dirty_;
};

// Phases 1-2: token k of tokens_, a filler, to extended slot `dst`.
void SegmentPlanner::Fill(const Candidate& tok, const RowRef& dst) {
  if (tok.incoming) {
    plan_.writes.push_back(PlannedWrite{tok.index, dst});
    return;
  }
  const Segment& src = (*c_.old)[static_cast<size_t>(tok.tier)];
  const BlockId block = src.block_of(tok.index, bt_);
  const int32_t slot = Segment::slot_of(tok.index, bt_);
  if (src.format == plan_.tier.format) {
    plan_.fills.push_back(PlannedCopy{RowRef{BlockRef{block, false}, slot}, dst});
  } else {
    plan_.converts.push_back(PlannedConvert{tok.tier, block, slot, dst});
  }
}

SegmentPlan SegmentPlanner::Extend() {
  const int64_t n = old_->size();
  old_blocks_ = static_cast<int64_t>(old_->blocks.size());
  plan_.extend = true;
  const int64_t total = n + static_cast<int64_t>(tokens_.size());
  plan_.fresh_blocks = std::max<int64_t>(0, CeilDiv(total, bt_) - old_blocks_);
  for (int32_t j = 0; j < plan_.fresh_blocks; ++j) plan_.blocks.push_back(BlockRef{j, true});
  plan_.positions.reserve(tokens_.size());
  plan_.scores.reserve(tokens_.size());
  plan_.writes.reserve(tokens_.size());
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const Candidate& tok = tokens_[k];
    const RowRef dst = Extended(n + static_cast<int64_t>(k));
    plan_.positions.push_back(tok.position + tok.delta);
    plan_.scores.push_back(tok.score);
    if (tok.delta != 0) plan_.rotations.push_back(PlannedRotation{dst, tok.delta});
    Fill(tok, dst);
  }
  return std::move(plan_);
}

// Stayers keep their old index, fillers follow the old end; then the tokens past the new end
// are assigned to the holes below it, lowest first.
void SegmentPlanner::Place() {
  n_ = old_ != nullptr ? old_->size() : 0;
  old_blocks_ = static_cast<int64_t>(old_ != nullptr ? old_->blocks.size() : 0);
  m_ = static_cast<int64_t>(tokens_.size());
  where_.resize(tokens_.size());
  int64_t fillers = 0;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const Candidate& tok = tokens_[k];
    where_[k] = !tok.incoming && tok.tier == plan_.carried ? tok.index : n_ + fillers++;
  }
  extended_ = n_ + fillers;
  owner_.assign(static_cast<size_t>(extended_), -1);
  for (size_t k = 0; k < tokens_.size(); ++k)
    owner_[static_cast<size_t>(where_[k])] = static_cast<int64_t>(k);
  std::vector<int64_t> holes, tails;
  for (int64_t e = 0; e < extended_; ++e) {
    if (e < m_ && owner_[static_cast<size_t>(e)] < 0) holes.push_back(e);
    if (e >= m_ && owner_[static_cast<size_t>(e)] >= 0) tails.push_back(e);
  }
  KVC_CHECK(holes.size() == tails.size()) << holes.size() << " holes, " << tails.size() << " tails";
  final_at_.resize(static_cast<size_t>(m_));
  for (int64_t i = 0; i < m_; ++i) final_at_[static_cast<size_t>(i)] = i;
  for (size_t h = 0; h < holes.size(); ++h) final_at_[static_cast<size_t>(holes[h])] = tails[h];
}

// Which blocks are copied instead of written in place, and the final block list.
void SegmentPlanner::ChooseBlocks() {
  const int64_t final_blocks = CeilDiv(m_, bt_);
  dirty_.assign(static_cast<size_t>(final_blocks), 0);
  // Frozen (shared) old blocks among those that stay: any change to one is a copy.
  std::vector<uint8_t> frozen;
  if (c_.shares != nullptr && c_.shares->frozen_blocks() > 0 && old_ != nullptr) {
    frozen.assign(static_cast<size_t>(final_blocks), 0);
    for (int64_t b = 0; b < std::min(final_blocks, old_blocks_); ++b) {
      frozen[static_cast<size_t>(b)] =
          c_.shares->Frozen(old_->format, old_->blocks[static_cast<size_t>(b)]) ? 1 : 0;
    }
  }
  for (int64_t i = 0; i < std::min(m_, n_); ++i) {
    const bool hole = final_at_[static_cast<size_t>(i)] != i;
    const int32_t delta = TokenAt(i).delta;
    const bool shared = !frozen.empty() && frozen[static_cast<size_t>(i / bt_)] != 0;
    if ((!hole && delta != 0) || (hole && (delta != 0 || !in_place_ || shared))) {
      dirty_[static_cast<size_t>(i / bt_)] = 1;
    }
  }
  // A shared block must stay full: a later append would write its free slots in place.
  if (!frozen.empty() && m_ % bt_ != 0 && frozen[static_cast<size_t>(m_ / bt_)] != 0) {
    dirty_[static_cast<size_t>(m_ / bt_)] = 1;
  }
  // A filler whose final slot is in a copied block is written there directly; the others are
  // staged after the old end, which may need fresh blocks of its own.
  final_of_.assign(static_cast<size_t>(extended_), -1);
  for (int64_t i = 0; i < m_; ++i)
    final_of_[static_cast<size_t>(final_at_[static_cast<size_t>(i)])] = i;
  int64_t staged_end = n_;
  for (int64_t e = n_; e < extended_; ++e) {
    const int64_t i = final_of_[static_cast<size_t>(e)];
    if (i >= 0 && !dirty_[static_cast<size_t>(i / bt_)]) staged_end = e + 1;
  }
  // Fresh blocks: first those the staged fillers need past the old end, then replacements.
  const int64_t filler_blocks = std::max<int64_t>(0, CeilDiv(staged_end, bt_) - old_blocks_);
  int32_t next_fresh = static_cast<int32_t>(filler_blocks);
  plan_.blocks.resize(static_cast<size_t>(final_blocks));
  for (int64_t b = 0; b < final_blocks; ++b) {
    plan_.blocks[static_cast<size_t>(b)] =
        dirty_[static_cast<size_t>(b)] ? BlockRef{next_fresh++, true} : Extended(b * bt_).block;
  }
  plan_.fresh_blocks = next_fresh;
  for (int64_t b = std::max(final_blocks, old_blocks_); b < old_blocks_ + filler_blocks; ++b) {
    plan_.transient.push_back(static_cast<int32_t>(b - old_blocks_));
  }
}

SegmentPlan SegmentPlanner::Plan(bool* rewrites) {
  Place();
  ChooseBlocks();
  auto final_slot = [&](int64_t i) {
    return RowRef{plan_.blocks[static_cast<size_t>(i / bt_)], static_cast<int32_t>(i % bt_)};
  };
  auto direct = [&](int64_t e) {  // a filler written straight into its copied block
    const int64_t i = final_of_[static_cast<size_t>(e)];
    return e >= n_ && dirty_[static_cast<size_t>(i / bt_)];
  };
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const int64_t e = where_[k];
    if (e < n_) continue;
    Fill(tokens_[k], direct(e) ? final_slot(final_of_[static_cast<size_t>(e)]) : Extended(e));
  }
  // Phases 3-5 and the new metadata, stored index by stored index.
  plan_.positions.resize(static_cast<size_t>(m_));
  plan_.scores.resize(static_cast<size_t>(m_));
  for (int64_t i = 0; i < m_; ++i) {
    const Candidate& tok = TokenAt(i);
    plan_.positions[static_cast<size_t>(i)] = tok.position + tok.delta;
    plan_.scores[static_cast<size_t>(i)] = tok.score;
    const int64_t from = final_at_[static_cast<size_t>(i)];
    const RowRef dst = final_slot(i);
    if (dirty_[static_cast<size_t>(i / bt_)]) {
      if (!direct(from)) plan_.cow.push_back(PlannedCopy{Extended(from), dst});
    } else if (from != i) {
      plan_.moves.push_back(PlannedCopy{Extended(from), dst});
    }
    if (tok.delta != 0) plan_.rotations.push_back(PlannedRotation{dst, tok.delta});
  }
  // Anything but new rows written after the old end changes what a stored index refers to.
  const bool pure_append = m_ == extended_ && plan_.cow.empty() && plan_.rotations.empty() &&
                           plan_.fills.empty() && plan_.converts.empty();
  if (!pure_append) *rewrites = true;
  return std::move(plan_);
}

}  // namespace

LanePlan PlanLane(const LaneChange& change, int block_tokens) {
  KVC_CHECK(change.old != nullptr && !change.tiers.empty());
  KVC_CHECK(change.entry.empty() || change.entry.size() == change.old->size());
  std::vector<std::vector<Candidate>> assigned = Assign(change);
  LanePlan plan;
  for (int t = 0; t < static_cast<int>(change.tiers.size()); ++t) {
    SegmentPlanner planner(change, t, block_tokens, std::move(assigned[static_cast<size_t>(t)]));
    if (Untouched(change, t)) {
      // Appending rows after untouched tokens moves nothing a reader indexes.
      plan.segments.push_back(planner.Extend());
    } else {
      plan.segments.push_back(planner.Plan(&plan.rewrites));
    }
  }
  // Old blocks no new segment keeps: everything of a tier nobody carries; of a carried tier,
  // the blocks past the new end and those replaced by copies.
  plan.freed.resize(change.old->size());
  for (int j = 0; j < static_cast<int>(change.old->size()); ++j) {
    const Segment& s = (*change.old)[static_cast<size_t>(j)];
    bool extended = false;
    std::vector<BlockId> still;
    for (const SegmentPlan& sp : plan.segments) {
      if (sp.carried != j) continue;
      extended |= sp.extend;
      for (const BlockRef& b : sp.blocks) {
        if (!b.fresh) still.push_back(b.id);
      }
    }
    if (extended) continue;  // every old block stays
    std::sort(still.begin(), still.end());
    for (BlockId b : s.blocks) {
      if (!std::binary_search(still.begin(), still.end(), b))
        plan.freed[static_cast<size_t>(j)].push_back(b);
    }
    if (!plan.freed[static_cast<size_t>(j)].empty() && s.size() > 0) plan.rewrites = true;
  }
  return plan;
}

}  // namespace kvc::cachesvc
