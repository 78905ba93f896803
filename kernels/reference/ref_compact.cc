// Reference tail-to-hole compaction.
#include <cstring>
#include <vector>

#include "kvc/kernels/paged_view.h"
#include "reference/reference_ops.h"

namespace kvc::kernels::reference {

void Compact(const CompactArgs& a) {
  const BlockLayout& l = a.arena.layout;
  for (int32_t lane = 0; lane < a.lanes.num_lanes; ++lane) {
    const int32_t n = a.lanes.num_tokens[lane];
    const uint8_t* keep = a.keep + static_cast<size_t>(lane) * a.lanes.max_tokens;
    int32_t kept = 0;
    for (int32_t t = 0; t < n; ++t) kept += keep[t] != 0;
    std::vector<int32_t> holes, sources;
    for (int32_t t = 0; t < kept; ++t) {
      if (!keep[t]) holes.push_back(t);
    }
    for (int32_t t = kept; t < n; ++t) {
      if (keep[t]) sources.push_back(t);
    }
    for (size_t i = 0; i < holes.size(); ++i) {
      int32_t db, ds, sb, ss;
      LaneTokenSlot(a.lanes, l.block_tokens, lane, holes[i], &db, &ds);
      LaneTokenSlot(a.lanes, l.block_tokens, lane, sources[i], &sb, &ss);
      std::memcpy(KeyRecord(a.arena, db, ds), KeyRecord(a.arena, sb, ss), l.record_bytes);
      std::memcpy(ValueRecord(a.arena, db, ds), ValueRecord(a.arena, sb, ss), l.record_bytes);
      *PositionPtr(a.arena, db, ds) = *PositionPtr(a.arena, sb, ss);
      *ScorePtr(a.arena, db, ds) = *ScorePtr(a.arena, sb, ss);
    }
    a.new_num_tokens[lane] = kept;
    a.new_num_blocks[lane] = (kept + l.block_tokens - 1) / l.block_tokens;
    if (a.moved != nullptr) a.moved[lane] = static_cast<int32_t>(holes.size());
  }
}

}  // namespace kvc::kernels::reference
