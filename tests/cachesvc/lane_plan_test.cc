// PlanLane against a simulated pool memory: every slot holds the identity of the token
// whose record is in it. Random lanes (one or two tiers, drops, incoming rows, re-rotation,
// format changes, a residual added) are planned and the plan is executed phase by phase on
// the simulation, checking what makes a mutation all-or-nothing and correct:
//  - phases 1-4 write only slots no old token occupies (fresh blocks, past the old end);
//  - phase 5 (in place) writes only slots whose old token the new state drops, reads only
//    slots it does not write, and happens in tier 0 only;
//  - afterwards each new segment's slots hold exactly the tokens an independent model says
//    the tier keeps (newest `limit` in the residual, the rest below), with their positions
//    (moved by their delta), scores, and re-rotation applied once at the final slot;
//  - every old block is either still referenced or freed, no block is referenced twice,
//    and transient blocks are freed.
#include "cachesvc/core/plan/lane_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "gtest/gtest.h"

namespace kvc::cachesvc {
namespace {

constexpr int kBlock = 4;

// Token identity: old tokens are 1000 * (tier + 1) + index; incoming rows 100000 + row.
struct Cell {
  int64_t token = -1;
  int32_t rotated = 0;  // sum of deltas applied to this record
};

struct Memory {
  std::map<std::pair<StorageFormat, BlockId>, std::vector<Cell>> blocks;
  std::vector<Cell>& block(StorageFormat f, BlockId b) {
    auto& v = blocks[{f, b}];
    if (v.empty()) v.resize(kBlock);
    return v;
  }
};

struct Expected {
  int64_t token;
  int32_t position;
  float score;
  int32_t delta;
};

class LanePlanTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(LanePlanTest, RandomChangesExecuteSafelyAndMatchTheModel) {
  std::mt19937 rng(GetParam());
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const StorageFormat kRaw = StorageFormat::kF16, kLow = StorageFormat::kInt8;
  int extends = 0;
  for (int round = 0; round < 300; ++round) {
    SCOPED_TRACE(::testing::Message() << "seed " << GetParam() << " round " << round);
    Memory mem;
    BlockId next_block = 1;
    // Old state.
    const bool two_tiers = uniform(0, 1);
    std::vector<Tier> old_tiers{Tier{two_tiers ? kLow : kRaw, Tier::kUnlimited}};
    if (two_tiers) old_tiers.push_back(Tier{kRaw, uniform(1, 9)});
    std::vector<Segment> old;
    int32_t next_pos = 0;
    std::vector<std::tuple<int, int64_t, int32_t>> by_position;  // (tier, index, position)
    for (size_t t = 0; t < old_tiers.size(); ++t) {
      Segment s;
      s.format = old_tiers[t].format;
      const int64_t n = t == 0 ? uniform(0, 23) : uniform(0, static_cast<int>(old_tiers[t].limit));
      for (int64_t i = 0; i < n; ++i) {
        s.positions.push_back(next_pos++);
        s.scores.push_back(static_cast<float>(uniform(0, 99)));
      }
      for (int64_t b = 0; b < CeilDiv(n, kBlock); ++b) s.blocks.push_back(next_block++);
      // Compaction scrambles stored order: shuffle positions within the segment.
      std::vector<size_t> perm(static_cast<size_t>(n));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> pos = s.positions;
      for (size_t i = 0; i < perm.size(); ++i) s.positions[i] = pos[perm[i]];
      for (int64_t i = 0; i < n; ++i) {
        mem.block(s.format, s.block_of(i, kBlock))[static_cast<size_t>(i % kBlock)].token =
            1000 * static_cast<int64_t>(t + 1) + i;
      }
      old.push_back(std::move(s));
    }
    // The change.
    LaneChange c;
    c.old = &old;
    c.tiers = old_tiers;
    const int kind = uniform(0, 3);  // 0 append, 1 evict, 2 convert tier 0, 3 add residual
    if (kind == 2) c.tiers[0].format = c.tiers[0].format == kLow ? kRaw : kLow;
    if (kind == 3 && !two_tiers) {
      c.tiers = {Tier{uniform(0, 1) ? kLow : kRaw, Tier::kUnlimited}, Tier{kRaw, uniform(1, 9)}};
      c.entry = {1};
    }
    const int64_t incoming = kind == 0 ? uniform(1, 11) : (kind == 1 ? uniform(0, 3) : 0);
    for (int64_t r = 0; r < incoming; ++r) c.incoming_positions.push_back(next_pos++);
    const bool drops = kind != 0 || uniform(0, 1);
    const bool rotate = uniform(0, 2) == 0;
    // Empty keep/delta (as a plain append passes them) lets a tier take the extend path.
    std::vector<std::vector<uint8_t>> keep(old.size());
    std::vector<std::vector<int32_t>> delta(old.size());
    for (size_t t = 0; t < old.size(); ++t) {
      for (int64_t i = 0; i < old[t].size(); ++i) {
        keep[t].push_back(drops && uniform(0, 2) == 0 ? 0 : 1);
        delta[t].push_back(rotate ? uniform(-3, 3) : 0);
      }
    }
    if (drops) c.keep = keep;
    if (rotate) c.delta = delta;
    for (int64_t r = 0; r < incoming; ++r) {
      c.incoming_keep.push_back(drops && uniform(0, 3) == 0 ? 0 : 1);
      c.incoming_delta.push_back(rotate ? uniform(-3, 3) : 0);
    }
    c.tier0_in_place = uniform(0, 3) != 0;

    const LanePlan plan = PlanLane(c, kBlock);
    ASSERT_EQ(plan.segments.size(), c.tiers.size());

    // Independent model: kept tokens by position, newest into the newest tier (within its
    // limit), tokens only ever moving to the same or an older tier.
    std::vector<std::vector<Expected>> want(c.tiers.size());
    {
      std::vector<std::vector<Expected>> entering(c.tiers.size());
      for (size_t t = 0; t < old.size(); ++t) {
        const size_t to = c.entry.empty() ? t : static_cast<size_t>(c.entry[t]);
        for (int64_t i = 0; i < old[t].size(); ++i) {
          if (!keep[t][static_cast<size_t>(i)]) continue;
          entering[to].push_back(Expected{
              1000 * static_cast<int64_t>(t + 1) + i, old[t].positions[static_cast<size_t>(i)],
              old[t].scores[static_cast<size_t>(i)], delta[t][static_cast<size_t>(i)]});
        }
      }
      for (int64_t r = 0; r < incoming; ++r) {
        if (!c.incoming_keep[static_cast<size_t>(r)]) continue;
        entering.back().push_back(Expected{100000 + r, c.incoming_positions[static_cast<size_t>(r)],
                                           0.0f, c.incoming_delta[static_cast<size_t>(r)]});
      }
      std::vector<Expected> carry;
      for (int t = static_cast<int>(c.tiers.size()) - 1; t >= 0; --t) {
        std::vector<Expected> mine = entering[static_cast<size_t>(t)];
        mine.insert(mine.end(), carry.begin(), carry.end());
        std::sort(mine.begin(), mine.end(),
                  [](const Expected& a, const Expected& b) { return a.position < b.position; });
        carry.clear();
        const int64_t limit = c.tiers[static_cast<size_t>(t)].limit;
        while (limit != Tier::kUnlimited && static_cast<int64_t>(mine.size()) > limit) {
          carry.push_back(mine.front());
          mine.erase(mine.begin());
        }
        want[static_cast<size_t>(t)] = mine;
      }
    }

    // Execute on the simulation.
    std::set<std::pair<StorageFormat, BlockId>> live;  // old slots holding a token: (f, b*kBlock+s)
    std::set<std::tuple<StorageFormat, BlockId, int32_t>> live_slots;
    for (const Segment& s : old) {
      for (int64_t i = 0; i < s.size(); ++i)
        live_slots.insert({s.format, s.block_of(i, kBlock), Segment::slot_of(i, kBlock)});
    }
    std::vector<std::vector<BlockId>> fresh(plan.segments.size());
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      for (int64_t j = 0; j < plan.segments[t].fresh_blocks; ++j) fresh[t].push_back(next_block++);
    }
    auto resolve = [&](size_t t, const BlockRef& b) {
      return b.fresh ? fresh[t][static_cast<size_t>(b.id)] : b.id;
    };
    auto cell = [&](size_t t, const RowRef& r) -> Cell& {
      return mem.block(plan.segments[t].tier.format,
                       resolve(t, r.block))[static_cast<size_t>(r.slot)];
    };
    auto safe = [&](size_t t, const RowRef& r) {
      return live_slots.count({plan.segments[t].tier.format, resolve(t, r.block), r.slot}) == 0;
    };
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      const SegmentPlan& sp = plan.segments[t];
      for (const PlannedConvert& cv : sp.converts) {
        ASSERT_NE(old[static_cast<size_t>(cv.src_tier)].format, sp.tier.format);
        ASSERT_TRUE(safe(t, cv.dst)) << "convert into a live slot";
        cell(t, cv.dst) = mem.block(old[static_cast<size_t>(cv.src_tier)].format,
                                    cv.src_block)[static_cast<size_t>(cv.src_slot)];
      }
      for (const PlannedCopy& f : sp.fills) {
        ASSERT_TRUE(safe(t, f.dst)) << "fill into a live slot";
        cell(t, f.dst) = cell(t, f.src);
      }
      for (const PlannedWrite& w : sp.writes) {
        ASSERT_TRUE(safe(t, w.dst)) << "write into a live slot";
        cell(t, w.dst) = Cell{100000 + w.row, 0};
      }
    }
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      for (const PlannedCopy& cp : plan.segments[t].cow) {
        ASSERT_TRUE(cp.dst.block.fresh) << "copy-on-write into an old block";
        cell(t, cp.dst) = cell(t, cp.src);
      }
    }
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      for (const PlannedRotation& r : plan.segments[t].rotations) {
        ASSERT_TRUE(safe(t, r.row)) << "rotation of a live slot";
        cell(t, r.row).rotated += r.delta;
      }
    }
    std::set<std::tuple<StorageFormat, BlockId, int32_t>> move_dsts;
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      const SegmentPlan& sp = plan.segments[t];
      if (!sp.moves.empty()) {
        ASSERT_EQ(t, 0u) << "in-place moves outside tier 0";
        ASSERT_TRUE(c.tier0_in_place);
      }
      for (const PlannedCopy& m : sp.moves)
        move_dsts.insert({sp.tier.format, resolve(t, m.dst.block), m.dst.slot});
      for (const PlannedCopy& m : sp.moves) {
        ASSERT_EQ(move_dsts.count({sp.tier.format, resolve(t, m.src.block), m.src.slot}), 0u)
            << "a move reads a slot another move writes";
      }
      std::vector<Cell> sources;
      for (const PlannedCopy& m : sp.moves) sources.push_back(cell(t, m.src));
      for (size_t k = 0; k < sp.moves.size(); ++k) cell(t, sp.moves[k].dst) = sources[k];
    }

    // Final state against the model.
    std::set<std::pair<StorageFormat, BlockId>> referenced;
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      SegmentPlan sp = plan.segments[t];
      if (sp.extend) {
        // Appended after the carried segment's own tokens, which stay as they are.
        const Segment& kept = old[static_cast<size_t>(sp.carried)];
        ASSERT_EQ(static_cast<size_t>(sp.carried), t);
        std::vector<BlockRef> blocks;
        for (BlockId b : kept.blocks) blocks.push_back(BlockRef{b, false});
        blocks.insert(blocks.end(), sp.blocks.begin(), sp.blocks.end());
        sp.blocks = blocks;
        sp.positions.insert(sp.positions.begin(), kept.positions.begin(), kept.positions.end());
        sp.scores.insert(sp.scores.begin(), kept.scores.begin(), kept.scores.end());
      }
      const std::vector<Expected>& w = want[t];
      ASSERT_EQ(sp.positions.size(), w.size()) << "tier " << t;
      ASSERT_EQ(static_cast<int64_t>(sp.blocks.size()),
                CeilDiv(static_cast<int64_t>(w.size()), kBlock));
      for (const BlockRef& b : sp.blocks) {
        ASSERT_TRUE(referenced.insert({sp.tier.format, resolve(t, b)}).second)
            << "block used twice";
      }
      std::map<int64_t, Expected> by_token;
      for (const Expected& e : w) by_token[e.token] = e;
      for (size_t i = 0; i < w.size(); ++i) {
        const Cell& got = mem.block(sp.tier.format, resolve(t, sp.blocks[i / kBlock]))[i % kBlock];
        ASSERT_TRUE(by_token.count(got.token)) << "tier " << t << " index " << i << " holds token "
                                               << got.token << ", which it should not";
        const Expected& e = by_token[got.token];
        EXPECT_EQ(sp.positions[i], e.position + e.delta);
        EXPECT_EQ(sp.scores[i], e.score);
        EXPECT_EQ(got.rotated, e.delta) << "token " << got.token;
        by_token.erase(got.token);
      }
      EXPECT_TRUE(by_token.empty()) << by_token.size() << " tokens missing from tier " << t;
    }
    // Old blocks: referenced or freed, never both; fresh blocks: referenced or transient.
    for (size_t j = 0; j < old.size(); ++j) {
      std::set<BlockId> freed(plan.freed[j].begin(), plan.freed[j].end());
      for (BlockId b : old[j].blocks) {
        const bool still = referenced.count({old[j].format, b}) > 0;
        EXPECT_NE(still, freed.count(b) > 0) << "old block " << b << " of tier " << j;
      }
    }
    for (size_t t = 0; t < plan.segments.size(); ++t) {
      std::set<int32_t> transient(plan.segments[t].transient.begin(),
                                  plan.segments[t].transient.end());
      for (int32_t j = 0; j < static_cast<int32_t>(fresh[t].size()); ++j) {
        const bool used =
            referenced.count({plan.segments[t].tier.format, fresh[t][static_cast<size_t>(j)]}) > 0;
        EXPECT_NE(used, transient.count(j) > 0) << "fresh block " << j << " of tier " << t;
      }
    }
    // A pure append (nothing dropped, moved or rewritten) keeps stored indices valid.
    const bool nothing_moved = kind == 0 && !drops && !rotate && !two_tiers;
    if (nothing_moved) {
      EXPECT_FALSE(plan.rewrites);
      EXPECT_TRUE(plan.segments[0].extend);
      ++extends;
    }
  }
  EXPECT_GT(extends, 0) << "no round took the extend path";
}

INSTANTIATE_TEST_SUITE_P(Seeds, LanePlanTest, ::testing::Values(1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u));

TEST(LanePlanTest, AppendWithoutEvictionWritesAfterTheEndInPlace) {
  std::vector<Segment> old(1);
  old[0].format = StorageFormat::kF16;
  old[0].positions = {0, 1, 2, 3, 4, 5};
  old[0].scores.assign(6, 0.0f);
  old[0].blocks = {7, 9};
  LaneChange c;
  c.old = &old;
  c.tiers = {Tier{StorageFormat::kF16, Tier::kUnlimited}};
  c.incoming_positions = {6, 7, 8};
  const LanePlan plan = PlanLane(c, kBlock);
  const SegmentPlan& sp = plan.segments[0];
  EXPECT_FALSE(plan.rewrites);
  EXPECT_TRUE(sp.extend);         // planning cost follows the new rows, not the old
  EXPECT_EQ(sp.fresh_blocks, 1);  // tokens 8 .. needs a third block
  EXPECT_EQ(sp.positions, (std::vector<int32_t>{6, 7, 8}));
  ASSERT_EQ(sp.writes.size(), 3u);
  EXPECT_EQ(sp.writes[0].dst.block, (BlockRef{9, false}));
  EXPECT_EQ(sp.writes[0].dst.slot, 2);
  EXPECT_EQ(sp.writes[2].dst.block, (BlockRef{0, true}));
  EXPECT_TRUE(sp.moves.empty() && sp.cow.empty());
  EXPECT_TRUE(plan.freed[0].empty());
}

TEST(LanePlanTest, EvictionMovesTheTailIntoHolesAndFreesTrailingBlocks) {
  std::vector<Segment> old(1);
  old[0].format = StorageFormat::kInt8;
  for (int i = 0; i < 12; ++i) old[0].positions.push_back(i);
  old[0].scores.assign(12, 0.0f);
  old[0].blocks = {1, 2, 3};
  LaneChange c;
  c.old = &old;
  c.tiers = {Tier{StorageFormat::kInt8, Tier::kUnlimited}};
  // StreamingLLM-like: keep 2 sinks and the newest 4.
  c.keep = {{1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}};
  const LanePlan plan = PlanLane(c, kBlock);
  const SegmentPlan& sp = plan.segments[0];
  EXPECT_TRUE(plan.rewrites);
  EXPECT_EQ(sp.fresh_blocks, 0);  // no memory is needed to evict
  EXPECT_EQ(sp.moves.size(), 4u);
  EXPECT_EQ(sp.blocks, (std::vector<BlockRef>{{1, false}, {2, false}}));
  EXPECT_EQ(plan.freed[0], (std::vector<BlockId>{3}));
  EXPECT_EQ(sp.positions, (std::vector<int32_t>{0, 1, 8, 9, 10, 11}));
}

}  // namespace
}  // namespace kvc::cachesvc

namespace kvc::cachesvc {
namespace {

// Decoding with a full residual (R = one block): each new token ages the oldest raw token
// into tier 0 and takes its slot. The residual's block is copied once with the new row
// written straight into the copy: one fresh block, nothing staged and freed again.
TEST(LanePlanTest, ResidualDecodeStepCopiesOneBlockAndStagesNothing) {
  std::vector<Segment> old(2);
  old[0].format = StorageFormat::kInt4G32;
  for (int i = 0; i < 6; ++i) old[0].positions.push_back(i);
  old[0].scores.assign(6, 0.0f);
  old[0].blocks = {1, 2};
  old[1].format = StorageFormat::kF16;
  for (int i = 6; i < 10; ++i) old[1].positions.push_back(i);
  old[1].scores.assign(4, 0.0f);
  old[1].blocks = {3};
  LaneChange c;
  c.old = &old;
  c.tiers = {Tier{StorageFormat::kInt4G32, Tier::kUnlimited}, Tier{StorageFormat::kF16, 4}};
  c.incoming_positions = {10};
  const LanePlan plan = PlanLane(c, kBlock);
  const SegmentPlan& low = plan.segments[0];
  const SegmentPlan& raw = plan.segments[1];
  EXPECT_TRUE(low.extend);
  ASSERT_EQ(low.converts.size(), 1u);  // position 6 ages out
  EXPECT_EQ(low.positions, (std::vector<int32_t>{6}));
  EXPECT_EQ(raw.fresh_blocks, 1);
  EXPECT_TRUE(raw.transient.empty());
  ASSERT_EQ(raw.writes.size(), 1u);
  EXPECT_TRUE(raw.writes[0].dst.block.fresh);
  EXPECT_EQ(raw.cow.size(), 3u);  // the three raw tokens that stay
  EXPECT_EQ(plan.freed[1], (std::vector<BlockId>{3}));
  EXPECT_TRUE(plan.rewrites);
}

}  // namespace
}  // namespace kvc::cachesvc
