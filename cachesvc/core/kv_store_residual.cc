#include <algorithm>
#include <numeric>

#include "cachesvc/core/host_arena.h"
#include "cachesvc/core/lane_ops.h"
#include "cachesvc/core/residual.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Stored indices of a lane ordered by position, oldest first.
std::vector<int64_t> ByPosition(const std::vector<int32_t>& positions) {
  std::vector<int64_t> order(positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return positions[a] < positions[b]; });
  return order;
}

std::vector<int64_t> AllIndices(int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// Grows lane (layer, h) of `table` by `n` tokens with blocks taken from the back of *fresh;
// returns the stored index of the first new token.
int64_t GrowLane(BlockTable& table, int layer, int h, int64_t n, std::vector<BlockId>* fresh) {
  HeadBlocks& head = table.head(layer, h);
  const int64_t grow = table.BlocksToGrow(head.tokens, n);
  KVC_CHECK(static_cast<int64_t>(fresh->size()) >= grow);
  head.blocks.insert(head.blocks.end(), fresh->end() - grow, fresh->end());
  fresh->resize(fresh->size() - static_cast<size_t>(grow));
  const int64_t first = head.tokens;
  head.tokens += n;
  return first;
}

}  // namespace

ResidualSplit SplitAppend(int64_t residual, int64_t n, int64_t limit) {
  const int64_t move = std::max<int64_t>(0, residual + n - limit);
  ResidualSplit s;
  s.age = std::min(residual, move);
  s.direct = move - s.age;
  return s;
}

absl::Status AppendWithResidualLocked(Sequence& seq, int layer, int64_t start, int64_t n,
                                      DType dtype, const char* keys, const char* values) {
  BlockPool* pool = seq.pool();
  const PoolGeometry& g = pool->options().geometry;
  const StorageFormat low = seq.format(), raw = seq.raw_format();
  BlockTable& main = seq.table();
  BlockTable& res = seq.residual();
  const int64_t c = seq.residual_tokens(layer);
  const ResidualSplit s = SplitAppend(c, n, seq.residual_limit());
  const int64_t kept_residual = c - s.age;
  int64_t low_need = 0, raw_need = 0;
  for (int h = 0; h < g.num_kv_heads; ++h) {
    low_need += main.BlocksToGrow(main.head(layer, h).tokens, s.age + s.direct);
    raw_need += BlockTable::CeilDiv(kept_residual + n - s.direct, g.block_tokens) -
                BlockTable::CeilDiv(kept_residual, g.block_tokens);
  }
  std::vector<BlockId> low_fresh, raw_fresh;
  KVC_RETURN_IF_ERROR(pool->Allocate(low, low_need, &low_fresh));
  if (absl::Status st = pool->Allocate(raw, raw_need, &raw_fresh); !st.ok()) {
    pool->Free(low, low_fresh);
    return st;
  }
  const size_t elem = kernels::DTypeSize(dtype);
  const int64_t stride = int64_t{g.num_kv_heads} * g.head_dim;
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(start));
  std::vector<uint8_t> keep(static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(c), 1);
  for (int h = 0; h < g.num_kv_heads; ++h) {
    // 1. The oldest residual tokens age out: dequantized exactly (raw), requantized, with
    //    their scores.
    if (s.age > 0) {
      std::vector<int64_t> order = ByPosition(LanePositions(pool, raw, res, layer, h));
      order.resize(static_cast<size_t>(s.age));
      for (int64_t i : order) keep[static_cast<size_t>(h * c + i)] = 0;
      KVC_ASSIGN_OR_RETURN(const LaneRows rows, ReadLaneRows(pool, raw, res, layer, h, order));
      KVC_RETURN_IF_ERROR(AppendLaneRows(pool, low, main, layer, h, rows, &low_fresh));
    }
    // 2. New tokens already older than the residual's reach go straight to the low-bit part.
    if (s.direct > 0) {
      const int64_t first = GrowLane(main, layer, h, s.direct, &low_fresh);
      KVC_RETURN_IF_ERROR(WriteLaneRows(pool, low, main, layer, h, first, s.direct, dtype,
                                        keys + static_cast<size_t>(h * g.head_dim) * elem,
                                        values + static_cast<size_t>(h * g.head_dim) * elem, stride,
                                        positions.data(), nullptr));
    }
  }
  if (s.age > 0) {
    // Compaction moves residual tokens between slots: a streaming Fetch must notice.
    seq.bump_generation();
    KVC_RETURN_IF_ERROR(CompactLayer(pool, raw, res, layer, keep, static_cast<size_t>(c)).status());
  }
  // 3. The newest tokens join the residual.
  const int64_t rest = n - s.direct;
  for (int h = 0; h < g.num_kv_heads && rest > 0; ++h) {
    const int64_t first = GrowLane(res, layer, h, rest, &raw_fresh);
    const size_t offset = static_cast<size_t>(s.direct * stride + h * g.head_dim) * elem;
    KVC_RETURN_IF_ERROR(WriteLaneRows(pool, raw, res, layer, h, first, rest, dtype, keys + offset,
                                      values + offset, stride, positions.data() + s.direct,
                                      nullptr));
  }
  KVC_CHECK(low_fresh.empty() && raw_fresh.empty()) << "append allocated blocks it did not use";
  return absl::OkStatus();
}

absl::Status ScoreWithResidualLocked(Sequence& seq, int layer, kernels::SnapKvScoreArgs args) {
  BlockPool* pool = seq.pool();
  const PoolGeometry& g = pool->options().geometry;
  const int bt = g.block_tokens;
  const StorageFormat low = seq.format(), raw = seq.raw_format();
  const kernels::BlockLayout layout =
      kernels::MakeBlockLayout(StorageFormat::kF32, g.head_dim, g.block_tokens);
  BlockTable::LaneArrays lanes;
  lanes.block_offsets.push_back(0);
  for (int h = 0; h < g.num_kv_heads; ++h) {
    const int64_t n = seq.stored_tokens(layer, h);
    const int32_t first_block = lanes.block_offsets.back();
    for (int64_t b = 0; b < BlockTable::CeilDiv(n, bt); ++b)
      lanes.block_ids.push_back(first_block + static_cast<int32_t>(b));
    lanes.block_offsets.push_back(static_cast<int32_t>(lanes.block_ids.size()));
    lanes.num_tokens.push_back(static_cast<int32_t>(n));
    lanes.max_tokens = std::max(lanes.max_tokens, static_cast<int32_t>(n));
  }
  const int32_t num_blocks = lanes.block_offsets.back();
  KVC_ASSIGN_OR_RETURN(HostArena memory,
                       HostArena::Create(static_cast<size_t>(num_blocks) * layout.block_bytes));
  const kernels::PagedArena temp{memory.data(), layout, num_blocks};
  // Fill: the low-bit part, then the residual (the order SnapKV's pooling sees).
  for (int h = 0; h < g.num_kv_heads; ++h) {
    int64_t at = 0;
    for (const auto& [table, format] :
         {std::pair<const BlockTable*, StorageFormat>{&seq.table(), low},
          std::pair<const BlockTable*, StorageFormat>{&seq.residual(), raw}}) {
      const int64_t n = table->head(layer, h).tokens;
      if (n == 0) continue;
      KVC_ASSIGN_OR_RETURN(const LaneRows rows,
                           ReadLaneRows(pool, format, *table, layer, h, AllIndices(n)));
      std::vector<int32_t> blocks(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) {
        blocks[static_cast<size_t>(t)] =
            lanes.block_offsets[static_cast<size_t>(h)] + static_cast<int32_t>((at + t) / bt);
        slots[static_cast<size_t>(t)] = static_cast<int32_t>((at + t) % bt);
      }
      kernels::WriteTokensArgs w;
      w.arena = temp;
      w.num_rows = static_cast<int32_t>(n);
      w.dtype = DType::kF32;
      w.keys = rows.keys.data();
      w.values = rows.values.data();
      w.positions = rows.positions.data();
      w.dst_blocks = blocks.data();
      w.dst_slots = slots.data();
      KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->WriteTokens(w, {}), "WriteTokens"));
      for (int64_t t = 0; t < n; ++t) {
        *kernels::ScorePtr(temp, blocks[static_cast<size_t>(t)], slots[static_cast<size_t>(t)]) =
            rows.scores[static_cast<size_t>(t)];
      }
      at += n;
    }
  }
  args.arena = temp;
  args.lanes = lanes.view();
  KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->SnapKvScore(args, {}), "SnapKvScore"));
  // Scores back to each token's own block.
  for (int h = 0; h < g.num_kv_heads; ++h) {
    int64_t at = 0;
    for (const auto& [table, format] :
         {std::pair<const BlockTable*, StorageFormat>{&seq.table(), low},
          std::pair<const BlockTable*, StorageFormat>{&seq.residual(), raw}}) {
      const HeadBlocks& head = table->head(layer, h);
      const kernels::PagedArena arena = pool->arena(format);
      for (int64_t t = 0; t < head.tokens; ++t, ++at) {
        *kernels::ScorePtr(arena, head.blocks[static_cast<size_t>(t / bt)],
                           static_cast<int32_t>(t % bt)) =
            *kernels::ScorePtr(
                temp, lanes.block_offsets[static_cast<size_t>(h)] + static_cast<int32_t>(at / bt),
                static_cast<int32_t>(at % bt));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MoveNewestToResidualLocked(Sequence& seq, int layer, int64_t count,
                                        std::vector<BlockId>* fresh_raw) {
  BlockPool* pool = seq.pool();
  const PoolGeometry& g = pool->options().geometry;
  const StorageFormat raw = seq.raw_format();
  KVC_CHECK(seq.format() == raw && seq.residual_tokens(layer) == 0);
  BlockTable& main = seq.table();
  BlockTable& res = seq.residual();
  const int64_t stride = std::max<int64_t>(1, main.Lanes(layer).max_tokens);
  std::vector<uint8_t> keep(static_cast<size_t>(g.num_kv_heads * stride), 1);
  const kernels::PagedArena arena = pool->arena(raw);
  for (int h = 0; h < g.num_kv_heads; ++h) {
    std::vector<int64_t> order = ByPosition(LanePositions(pool, raw, main, layer, h));
    const int64_t k = std::min<int64_t>(count, static_cast<int64_t>(order.size()));
    order.erase(order.begin(), order.end() - k);  // the k newest, oldest first
    const int64_t first = GrowLane(res, layer, h, k, fresh_raw);
    std::vector<int32_t> sb, ss, db, ds;
    for (int64_t t = 0; t < k; ++t) {
      const int64_t i = order[static_cast<size_t>(t)];
      keep[static_cast<size_t>(h * stride + i)] = 0;
      const HeadBlocks& from = main.head(layer, h);
      sb.push_back(from.blocks[static_cast<size_t>(i / g.block_tokens)]);
      ss.push_back(static_cast<int32_t>(i % g.block_tokens));
      const HeadBlocks& to = res.head(layer, h);
      db.push_back(to.blocks[static_cast<size_t>((first + t) / g.block_tokens)]);
      ds.push_back(static_cast<int32_t>((first + t) % g.block_tokens));
    }
    if (k == 0) continue;
    kernels::GatherArgs a;
    a.src = arena;
    a.dst = arena;
    a.num_rows = static_cast<int32_t>(k);
    a.src_blocks = sb.data();
    a.src_slots = ss.data();
    a.dst_blocks = db.data();
    a.dst_slots = ds.data();
    KVC_RETURN_IF_ERROR(FromKernelStatus(pool->backend()->Gather(a, {}), "Gather"));
  }
  return CompactLayer(pool, raw, main, layer, keep, static_cast<size_t>(stride)).status();
}

}  // namespace kvc::cachesvc
