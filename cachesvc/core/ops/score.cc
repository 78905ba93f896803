#include "cachesvc/core/ops/score.h"

#include <algorithm>
#include <functional>

#include "cachesvc/core/ops/transaction.h"
#include "cachesvc/core/pool/op_stage.h"
#include "cachesvc/core/sequence/tier_lanes.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// The request's part of the arguments, its arrays staged.
kernels::SnapKvScoreArgs ScoreArgs(const PoolGeometry& g, const ScoreRequest& r, OpStage& stage) {
  kernels::SnapKvScoreArgs a;
  a.group_size = g.num_query_heads / g.num_kv_heads;
  a.window = r.window;
  a.query_dtype = r.query_dtype;
  a.queries = stage.In(static_cast<const char*>(r.queries), r.queries_bytes);
  a.query_positions = stage.In(r.positions.data(), r.positions.size());
  a.pool_kernel = r.pool_kernel;
  a.pool = r.pooling;
  a.mode = r.mode;
  return a;
}

// Launches one scoring op over `lanes` of `arena`: key positions and scores (in: the stored
// ones, out: the new ones) are [num_lanes, lanes.max_tokens] host arrays to stage.
using ScoreLaunch = std::function<absl::Status(OpStage& stage, const kernels::PagedArena& arena,
                                               const kernels::LaneTable& lanes,
                                               const int32_t* key_positions, float* scores)>;

// Lanes whose tokens sit in more than one tier are scored in one f32 copy of the layer
// (softmax over every stored key needs them in one arena), tiers in order.
absl::StatusOr<std::vector<std::vector<float>>> ScoreAcrossTiers(BlockPool* pool,
                                                                 const SequenceStorage& st,
                                                                 int layer,
                                                                 const ScoreLaunch& launch) {
  const PoolGeometry& g = pool->options().geometry;
  const int heads = g.num_kv_heads, bt = g.block_tokens;
  TierLanes all;
  all.block_offsets.push_back(0);
  for (int h = 0; h < heads; ++h) {
    const int64_t n = st.lane_tokens(layer, h);
    for (int64_t b = 0; b < CeilDiv(n, bt); ++b) {
      all.block_ids.push_back(static_cast<int32_t>(all.block_ids.size()));
    }
    all.block_offsets.push_back(static_cast<int32_t>(all.block_ids.size()));
    all.num_tokens.push_back(static_cast<int32_t>(n));
    all.max_tokens = std::max(all.max_tokens, static_cast<int32_t>(n));
  }
  const kernels::BlockLayout layout = kernels::MakeBlockLayout(StorageFormat::kF32, g.head_dim, bt);
  OpStage stage(pool);
  const kernels::PagedArena temp{stage.Scratch<char>(all.block_ids.size() * layout.block_bytes),
                                 layout, static_cast<int32_t>(all.block_ids.size())};
  const size_t stride = static_cast<size_t>(all.max_tokens);
  all.positions.assign(static_cast<size_t>(heads) * stride, 0);
  all.scores.assign(all.positions.size(), 0.0f);
  std::vector<int64_t> at(static_cast<size_t>(heads), 0);
  for (int t = 0; t < static_cast<int>(st.tiers().size()); ++t) {
    std::vector<int32_t> src_b, src_s, dst_b, dst_s;
    for (int h = 0; h < heads; ++h) {
      const Segment& s = st.lane(layer, h)[static_cast<size_t>(t)];
      for (int64_t i = 0; i < s.size(); ++i) {
        const int64_t k = at[static_cast<size_t>(h)]++;
        src_b.push_back(s.block_of(i, bt));
        src_s.push_back(Segment::slot_of(i, bt));
        dst_b.push_back(all.block_offsets[static_cast<size_t>(h)] + static_cast<int32_t>(k / bt));
        dst_s.push_back(static_cast<int32_t>(k % bt));
        all.positions[static_cast<size_t>(h) * stride + static_cast<size_t>(k)] =
            s.positions[static_cast<size_t>(i)];
        all.scores[static_cast<size_t>(h) * stride + static_cast<size_t>(k)] =
            s.scores[static_cast<size_t>(i)];
      }
    }
    if (src_b.empty()) continue;
    // The tier's rows in f32, between its arena and the temporary one (scratch: on a device
    // pool they never leave the device).
    const size_t rows = src_b.size();
    float* k = stage.Scratch<float>(rows * static_cast<size_t>(g.head_dim));
    float* v = stage.Scratch<float>(rows * static_cast<size_t>(g.head_dim));
    kernels::ReadTokensArgs r;
    r.arena = pool->arena(st.tiers()[static_cast<size_t>(t)].format);
    r.num_rows = static_cast<int32_t>(rows);
    r.dtype = DType::kF32;
    r.keys = k;
    r.values = v;
    r.src_blocks = stage.In(src_b.data(), rows);
    r.src_slots = stage.In(src_s.data(), rows);
    KVC_RETURN_IF_ERROR(stage.Launch(
        "ReadTokens", [&](kernels::StreamHandle s) { return pool->backend()->ReadTokens(r, s); }));
    kernels::WriteTokensArgs w;
    w.arena = temp;
    w.num_rows = r.num_rows;
    w.dtype = DType::kF32;
    w.keys = k;
    w.values = v;
    w.dst_blocks = stage.In(dst_b.data(), rows);
    w.dst_slots = stage.In(dst_s.data(), rows);
    KVC_RETURN_IF_ERROR(stage.Launch("WriteTokens", [&](kernels::StreamHandle s) {
      return pool->backend()->WriteTokens(w, s);
    }));
  }
  KVC_RETURN_IF_ERROR(
      launch(stage, temp, stage.In(all.view()), all.positions.data(), all.scores.data()));
  KVC_RETURN_IF_ERROR(stage.Finish());
  std::vector<std::vector<float>> out;
  out.reserve(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h) out.push_back(all.LaneScores(h));
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> ScoreLayerWith(BlockPool* pool,
                                                               const SequenceStorage& st, int layer,
                                                               const ScoreLaunch& launch) {
  const int heads = st.num_kv_heads();
  int only = -1;
  for (int t = 0; t < static_cast<int>(st.tiers().size()); ++t) {
    for (int h = 0; h < heads; ++h) {
      if (st.lane(layer, h)[static_cast<size_t>(t)].size() == 0) continue;
      if (only >= 0 && only != t) return ScoreAcrossTiers(pool, st, layer, launch);
      only = t;
    }
  }
  if (only < 0) return std::vector<std::vector<float>>(static_cast<size_t>(heads));
  // Every token of the layer is in one tier: score it where it is.
  const TierLanes lanes = BuildTierLanes(st, layer, only);
  std::vector<float> scores = lanes.scores;
  OpStage stage(pool);
  KVC_RETURN_IF_ERROR(launch(stage, pool->arena(st.tiers()[static_cast<size_t>(only)].format),
                             stage.In(lanes.view()), lanes.positions.data(), scores.data()));
  KVC_RETURN_IF_ERROR(stage.Finish());
  std::vector<std::vector<float>> out;
  for (int h = 0; h < heads; ++h) {
    const auto begin = scores.begin() + static_cast<std::ptrdiff_t>(h) * lanes.max_tokens;
    out.emplace_back(begin, begin + lanes.num_tokens[static_cast<size_t>(h)]);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<float>>> ScoreLayer(BlockPool* pool,
                                                           const SequenceStorage& st, int layer,
                                                           const ScoreRequest& request) {
  const PoolGeometry& g = pool->options().geometry;
  return ScoreLayerWith(
      pool, st, layer,
      [&](OpStage& stage, const kernels::PagedArena& arena, const kernels::LaneTable& lanes,
          const int32_t* positions, float* scores) {
        kernels::SnapKvScoreArgs a = ScoreArgs(g, request, stage);
        a.arena = arena;
        a.lanes = lanes;
        const size_t n =
            static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(lanes.max_tokens);
        a.key_positions = stage.In(positions, n);
        a.scores = stage.InOut(scores, n);
        return stage.Launch("SnapKvScore", [&](kernels::StreamHandle s) {
          return pool->backend()->SnapKvScore(a, s);
        });
      });
}

absl::StatusOr<std::vector<std::vector<float>>> ScoreLayerExpected(
    BlockPool* pool, const SequenceStorage& st, int layer, const ExpectedScoreRequest& request) {
  const PoolGeometry& g = pool->options().geometry;
  const size_t d = static_cast<size_t>(g.head_dim);
  const size_t qh = static_cast<size_t>(g.num_query_heads);
  return ScoreLayerWith(
      pool, st, layer,
      [&](OpStage& stage, const kernels::PagedArena& arena, const kernels::LaneTable& lanes,
          const int32_t* positions, float* scores) {
        kernels::ExpectedAttentionScoreArgs a;
        a.arena = arena;
        a.lanes = lanes;
        a.group_size = g.num_query_heads / g.num_kv_heads;
        a.mean = stage.In(request.mean.data(), qh * d);
        a.cov = request.cov.empty() ? nullptr : stage.In(request.cov.data(), qh * d * d);
        const size_t n =
            static_cast<size_t>(g.num_kv_heads) * static_cast<size_t>(lanes.max_tokens);
        a.key_positions = stage.In(positions, n);
        a.min_position = request.min_position;
        a.value_norm = request.value_norm;
        a.scores = stage.InOut(scores, n);
        return stage.Launch("ExpectedAttentionScore", [&](kernels::StreamHandle s) {
          return pool->backend()->ExpectedAttentionScore(a, s);
        });
      });
}

}  // namespace kvc::cachesvc
