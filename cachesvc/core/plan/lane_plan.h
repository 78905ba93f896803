// PlanLane: the one rule by which a lane's stored tokens change (append, residual aging,
// eviction, format conversion, re-rotation, setting a residual). Pure: it reads metadata
// and returns the new metadata plus the kernel work that produces it, in phases that keep a
// mutation all-or-nothing:
//
//   1-4  write only memory that no stored token occupies: fresh blocks, or slots past the
//        end of a segment. Any of them may fail and the sequence is unchanged.
//   5    `moves`: one in-place record copy per transaction (tail-to-hole compaction), into
//        slots whose tokens the new state drops. A failed op writes nothing, so this too can
//        fail without a trace; it is the last fallible step.
//   commit  swap in the new metadata and free the blocks nothing refers to any more.
//
// Placement (per target segment): the tokens that stay in the same blocks ("stayers") keep
// their stored index; everything else ("fillers": incoming rows, tokens from another tier or
// format) is first written after the old end; then the kept tokens past the new end move
// into the holes below it, lowest index first. A block that would need an in-place write the
// rules above forbid (a stayer whose key must be re-rotated, a hole filled by a token that
// must be re-rotated, any hole of a tier that may not move in place, any change to a shared
// block, a shared block that would end up partly filled) is copied into a fresh block instead
// (copy-on-write). Shared (frozen) blocks are thus never written: other holders keep them.
#pragma once

#include <cstdint>
#include <vector>

#include "cachesvc/core/base/segment.h"
#include "cachesvc/core/pool/block_shares.h"

namespace kvc::cachesvc {

// A block of the pool, or the j-th fresh block the segment plan allocates.
struct BlockRef {
  int32_t id = 0;
  bool fresh = false;
  bool operator==(const BlockRef& o) const { return id == o.id && fresh == o.fresh; }
};

struct RowRef {
  BlockRef block;
  int32_t slot = 0;
};

// Record copy inside one format's arena (Gather).
struct PlannedCopy {
  RowRef src;
  RowRef dst;
};
// A stored token of another format, dequantized (ReadTokens) and written here (WriteTokens).
struct PlannedConvert {
  int src_tier = 0;  // old tier (its segment's format) the token is read from
  BlockId src_block = 0;
  int32_t src_slot = 0;
  RowRef dst;
};
// Row `row` of the incoming (appended) rows, written here (WriteTokens).
struct PlannedWrite {
  int64_t row = 0;
  RowRef dst;
};
struct PlannedRotation {
  RowRef row;
  int32_t delta = 0;
};

// The new segment of one tier and the work that builds it. Op lists are in the order the
// phases run them; every destination row of phases 2-4 is in a fresh block or past the old
// end of the carried segment.
struct SegmentPlan {
  Tier tier;
  int carried = -1;  // old tier whose blocks this segment keeps using, or -1
  // The carried segment's tokens are all untouched (an append): `blocks`, `positions` and
  // `scores` are what comes after them, not the whole segment. Planning and committing
  // then cost O(new tokens), not O(stored tokens).
  bool extend = false;
  int64_t fresh_blocks = 0;  // blocks of tier.format to allocate
  std::vector<BlockRef> blocks;
  std::vector<int32_t> positions;
  std::vector<float> scores;
  std::vector<PlannedConvert> converts;    // phases 1-2
  std::vector<PlannedCopy> fills;          // phase 2: same-format tokens from other tiers
  std::vector<PlannedWrite> writes;        // phase 2
  std::vector<PlannedCopy> cow;            // phase 3: into fresh replacement blocks
  std::vector<PlannedRotation> rotations;  // phase 4
  std::vector<PlannedCopy> moves;          // phase 5: in place
  std::vector<int32_t> transient;          // fresh blocks freed again at commit (by fresh id)
};

struct LanePlan {
  std::vector<SegmentPlan> segments;        // one per new tier
  std::vector<std::vector<BlockId>> freed;  // per old tier: its blocks freed at commit
  bool rewrites = false;  // some stored token moved, changed or went away (not a pure append)
};

// What should happen to one lane.
struct LaneChange {
  // Old state: one segment per old tier.
  const std::vector<Segment>* old = nullptr;
  // New tiers. Usually the old tiers; a Compress may change formats or add a residual tier.
  std::vector<Tier> tiers;
  // entry[j]: the new tier old tier j's tokens enter (they may cascade to older tiers from
  // there, never to newer ones). Empty = the identity.
  std::vector<int> entry;
  // keep[j][i]: whether old token i of tier j survives. Empty (or an empty row) = keep all.
  std::vector<std::vector<uint8_t>> keep;
  // delta[j][i]: position change of a kept old token (its key is re-rotated). Empty = none.
  std::vector<std::vector<int32_t>> delta;
  // scores[j][i]: a kept old token's new score (a Compress that scored). Empty = as stored.
  std::vector<std::vector<float>> scores;
  // Incoming rows (appended tokens; they enter the newest tier): positions, which survive
  // (empty = all) and their position changes (empty = none).
  std::vector<int32_t> incoming_positions;
  std::vector<uint8_t> incoming_keep;
  std::vector<int32_t> incoming_delta;
  // Tier 0 may compact in place (phase 5). Only one arena may move in place per
  // transaction, so the executor allows it for tier 0 only and newer tiers copy on write.
  bool tier0_in_place = true;
  // The pool's shared blocks (block_shares.h): a frozen block is never written in place.
  // Null = nothing is shared.
  const BlockShares* shares = nullptr;
};

// Plans one lane. Invariant checks (sizes, formats) abort: inputs come from the core itself.
LanePlan PlanLane(const LaneChange& change, int block_tokens);

}  // namespace kvc::cachesvc
