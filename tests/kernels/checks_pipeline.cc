// The service's SnapKV path composed on one backend: score -> select -> gather the kept
// tokens into fresh blocks (copy-on-write compaction; positions and scores follow in the
// caller's metadata) -> decode with H2O accumulation. Attention is permutation-invariant over
// (key, value) pairs, so the backend gathers the survivors in reverse order and must still
// equal the reference decoding a fresh arena holding exactly the kept tokens in their
// original order (compression.md, suggested acceptance test 6).
#include <algorithm>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

// Fresh lanes for `kept[l]` tokens each and the (block, slot) of each of their tokens.
struct FreshLanes {
  LaneSpec spec;
  std::vector<int32_t> blocks, slots;
};
FreshLanes MakeFresh(const BlockLayout& l, const std::vector<int32_t>& kept, std::mt19937& rng) {
  FreshLanes f;
  f.spec = MakeLanes(l, kept, 0, rng);
  f.spec.Rows(&f.blocks, &f.slots);
  return f;
}

KVC_BACKEND_CHECK(SnapKvPipelineMatchesGatheredReference) {
  std::mt19937 rng(41);
  const int group = 2, window = 8, budget = 20, d = 64;
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32, StorageFormat::kNvfp4}) {
    const BlockLayout l = MakeBlockLayout(f, d, 16);
    const LaneSpec lanes = MakeLanes(l, {100, 29, 17}, 0, rng);
    const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
    const std::vector<int32_t> positions = MakePositions(lanes, /*shuffle=*/false, rng);
    const int32_t num_lanes = lanes.num_lanes();
    const std::vector<uint8_t> qw = ToDType(
        RandomRows(static_cast<int64_t>(num_lanes) * group * window, d, DataKind::kGaussian, rng),
        DType::kF32);
    const std::vector<uint8_t> qd =
        ToDType(RandomRows(static_cast<int64_t>(num_lanes) * group, d, DataKind::kGaussian, rng),
                DType::kF32);
    std::vector<int32_t> qpos;
    for (int32_t lane = 0; lane < num_lanes; ++lane) {
      for (int w = 0; w < window; ++w) qpos.push_back(lanes.tokens[lane] - window + w);
    }
    const size_t keep_n = static_cast<size_t>(num_lanes) * lanes.max_tokens;

    // Backend under test: score and select in its own memory.
    std::vector<float> scores;
    std::vector<uint8_t> keep;
    Session s(*ctx.backend, ctx);
    const DeviceLanes dl = UploadLanes(s, lanes, arena);
    {
      SnapKvScoreArgs sk;
      sk.arena = dl.arena;
      sk.lanes = dl.table;
      sk.group_size = group;
      sk.window = window;
      sk.query_dtype = DType::kF32;
      sk.queries = s.Upload(qw);
      sk.query_positions = s.Upload(qpos);
      sk.key_positions = s.Upload(positions);
      sk.pool_kernel = 7;
      sk.pool = PoolKind::kMax;
      sk.scores = static_cast<float*>(s.Alloc(keep_n * 4));
      if (!ctx.ExpectOk(ctx.backend->SnapKvScore(sk, StreamHandle{}), "SnapKvScore")) return;
      SelectArgs sel;
      sel.num_lanes = num_lanes;
      sel.num_tokens = dl.table.num_tokens;
      sel.max_tokens = lanes.max_tokens;
      sel.positions = sk.key_positions;
      sel.scores = sk.scores;
      sel.recent = window;
      sel.budget = budget;
      sel.keep = static_cast<uint8_t*>(s.Alloc(keep_n));
      if (!ctx.ExpectOk(ctx.backend->Select(sel, StreamHandle{}), "Select")) return;
      keep = s.DownloadBytes(sel.keep, keep_n);
      scores = s.Download(sk.scores, keep_n);
      // The reference selects the same set from the same metadata.
      std::vector<uint8_t> ref_keep(keep_n);
      sel.num_tokens = lanes.tokens.data();
      sel.positions = positions.data();
      sel.scores = scores.data();
      sel.keep = ref_keep.data();
      if (!ctx.ExpectOk(ctx.reference->Select(sel, StreamHandle{}), "reference Select")) return;
      ctx.Expect(ref_keep == keep, Str(StorageFormatName(f), ": keep equals the reference's"));
    }

    // The kept tokens in original order (reference side) and reversed (backend side).
    std::vector<int32_t> kept_tokens;
    std::vector<std::vector<int32_t>> kept(num_lanes);
    for (int32_t lane = 0; lane < num_lanes; ++lane) {
      const int32_t n = lanes.tokens[lane];
      for (int32_t t = 0; t < n; ++t) {
        if (keep[static_cast<size_t>(lane) * lanes.max_tokens + t]) kept[lane].push_back(t);
      }
      const int32_t want = std::min(n, window + budget);
      ctx.Expect(static_cast<int32_t>(kept[lane].size()) == want,
                 Str(StorageFormatName(f), " lane ", lane, ": kept ", kept[lane].size()));
      for (int32_t t = n - window; t < n; ++t) {
        ctx.Expect(keep[static_cast<size_t>(lane) * lanes.max_tokens + t] == 1,
                   "window tokens are kept");
      }
      kept_tokens.push_back(static_cast<int32_t>(kept[lane].size()));
    }
    const FreshLanes fresh = MakeFresh(l, kept_tokens, rng);
    std::vector<float> want_out(static_cast<size_t>(num_lanes) * group * d), got_out = want_out;
    const size_t fresh_n = static_cast<size_t>(num_lanes) * fresh.spec.max_tokens;
    std::vector<float> want_scores(fresh_n, 0.0f), got_scores(fresh_n, 0.0f);
    for (int side = 0; side < 2; ++side) {  // 0: reference, original order; 1: backend, reversed
      KernelBackend& b = side == 0 ? *ctx.reference : *ctx.backend;
      Session fs(b, ctx);
      std::vector<int32_t> sb, ss, db, ds;
      std::vector<float> fresh_scores(fresh_n, 0.0f);
      size_t row = 0;
      for (int32_t lane = 0; lane < num_lanes; ++lane) {
        const int32_t k = kept_tokens[lane];
        for (int32_t j = 0; j < k; ++j, ++row) {
          const int32_t t = side == 0 ? kept[lane][j] : kept[lane][k - 1 - j];
          sb.push_back(lanes.ids[lanes.offsets[lane] + t / 16]);
          ss.push_back(t % 16);
          db.push_back(fresh.blocks[row]);
          ds.push_back(fresh.slots[row]);
          fresh_scores[static_cast<size_t>(lane) * fresh.spec.max_tokens + j] =
              scores[static_cast<size_t>(lane) * lanes.max_tokens + t];
        }
      }
      GatherArgs g;
      g.src = PagedArena{fs.UploadBytes(arena.data(), arena.size()), l, lanes.num_blocks};
      g.dst = PagedArena{fs.Alloc(static_cast<size_t>(fresh.spec.num_blocks) * l.block_bytes), l,
                         fresh.spec.num_blocks};
      g.num_rows = static_cast<int32_t>(sb.size());
      g.src_blocks = fs.Upload(sb);
      g.src_slots = fs.Upload(ss);
      g.dst_blocks = fs.Upload(db);
      g.dst_slots = fs.Upload(ds);
      if (!ctx.ExpectOk(b.Gather(g, StreamHandle{}), "Gather")) return;
      const DeviceLanes fl = UploadLanes(fs, fresh.spec, {});
      DecodeAttentionArgs da;
      da.arena = g.dst;
      da.lanes = fl.table;
      da.group_size = group;
      da.dtype = DType::kF32;
      da.queries = fs.Upload(qd);
      da.out = fs.Alloc(static_cast<size_t>(num_lanes) * group * d * 4);
      da.scores = fs.Upload(fresh_scores);
      if (!ctx.ExpectOk(b.DecodeAttention(da, StreamHandle{}), "DecodeAttention")) return;
      (side == 0 ? want_out : got_out) = fs.Download(static_cast<const float*>(da.out),
                                                     static_cast<size_t>(num_lanes) * group * d);
      std::vector<float> out_scores = fs.Download(da.scores, fresh_n);
      if (side == 1) {  // back to original order for the comparison
        for (int32_t lane = 0; lane < num_lanes; ++lane) {
          float* row_scores = &out_scores[static_cast<size_t>(lane) * fresh.spec.max_tokens];
          std::reverse(row_scores, row_scores + kept_tokens[lane]);
        }
      }
      (side == 0 ? want_scores : got_scores) = out_scores;
    }
    ctx.Expect(Nmse(want_out, got_out) < 1e-9,
               Str(StorageFormatName(f), ": compacted attention NMSE ", Nmse(want_out, got_out)));
    ctx.Expect(Nmse(want_scores, got_scores) < 1e-10,
               Str(StorageFormatName(f), ": H2O scores after the step, NMSE ",
                   Nmse(want_scores, got_scores)));
  }
}

}  // namespace
}  // namespace kvc::kernels::testing
