// The service's SnapKV path composed on one backend: score -> select -> compact -> decode.
// Attention is permutation-invariant over (key, value) pairs, so decoding the compacted lanes
// must equal the reference decoding a fresh arena holding exactly the kept tokens in
// their original order (compression.md, suggested acceptance test 6).
#include <algorithm>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

KVC_BACKEND_CHECK(SnapKvPipelineMatchesGatheredReference) {
  std::mt19937 rng(41);
  const int G = 2, window = 8, budget = 20, d = 64;
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32, StorageFormat::kNvfp4}) {
    const BlockLayout l = MakeBlockLayout(f, d, 16);
    const LaneSpec lanes = MakeLanes(l, {100, 29, 17}, 0, rng);
    const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, false, rng);
    const int32_t L = lanes.num_lanes();
    const std::vector<uint8_t> qw = ToDType(
        RandomRows(static_cast<int64_t>(L) * G * window, d, DataKind::kGaussian, rng), DType::kF32);
    const std::vector<uint8_t> qd =
        ToDType(RandomRows(static_cast<int64_t>(L) * G, d, DataKind::kGaussian, rng), DType::kF32);
    std::vector<int32_t> qpos;
    for (int32_t lane = 0; lane < L; ++lane) {
      for (int w = 0; w < window; ++w) qpos.push_back(lanes.tokens[lane] - window + w);
    }
    const size_t keep_n = static_cast<size_t>(L) * lanes.max_tokens;

    // Backend under test: the whole pipeline in its own memory.
    std::vector<float> got;
    std::vector<uint8_t> keep;
    std::vector<int32_t> new_tokens, new_blocks;
    {
      Session s(*ctx.backend, ctx);
      DeviceLanes dl = UploadLanes(s, lanes, arena);
      SnapKvScoreArgs sk;
      sk.arena = dl.arena;
      sk.lanes = dl.table;
      sk.group_size = G;
      sk.window = window;
      sk.query_dtype = DType::kF32;
      sk.queries = s.Upload(qw);
      sk.query_positions = s.Upload(qpos);
      sk.pool_kernel = 7;
      sk.pool = PoolKind::kMax;
      if (!ctx.ExpectOk(ctx.backend->SnapKvScore(sk, StreamHandle{}), "SnapKvScore")) return;
      SelectArgs sel;
      sel.arena = dl.arena;
      sel.lanes = dl.table;
      sel.recent = window;
      sel.budget = budget;
      sel.keep = static_cast<uint8_t*>(s.Alloc(keep_n));
      if (!ctx.ExpectOk(ctx.backend->Select(sel, StreamHandle{}), "Select")) return;
      CompactArgs c;
      c.arena = dl.arena;
      c.lanes = dl.table;
      c.keep = sel.keep;
      c.new_num_tokens = static_cast<int32_t*>(s.Alloc(L * 4));
      c.new_num_blocks = static_cast<int32_t*>(s.Alloc(L * 4));
      if (!ctx.ExpectOk(ctx.backend->Compact(c, StreamHandle{}), "Compact")) return;
      keep = s.DownloadBytes(sel.keep, keep_n);
      new_tokens = s.Download(c.new_num_tokens, L);
      new_blocks = s.Download(c.new_num_blocks, L);
      LaneTable compacted = dl.table;
      compacted.num_tokens = s.Upload(new_tokens);
      DecodeAttentionArgs da;
      da.arena = dl.arena;
      da.lanes = compacted;
      da.group_size = G;
      da.dtype = DType::kF32;
      da.queries = s.Upload(qd);
      da.out = s.Alloc(static_cast<size_t>(L) * G * d * 4);
      if (!ctx.ExpectOk(ctx.backend->DecodeAttention(da, StreamHandle{}), "DecodeAttention"))
        return;
      got = s.Download(static_cast<const float*>(da.out), static_cast<size_t>(L) * G * d);
    }

    // Reference: the kept tokens (by the backend's own keep mask) gathered in original order.
    std::vector<int32_t> kept_tokens;
    std::vector<int32_t> sb, ss, db, ds;
    for (int32_t lane = 0; lane < L; ++lane) {
      const int32_t n = lanes.tokens[lane];
      const int32_t want = std::min(n, window + budget);
      int32_t k = 0;
      for (int32_t t = 0; t < n; ++t) {
        if (!keep[static_cast<size_t>(lane) * lanes.max_tokens + t]) continue;
        sb.push_back(lanes.ids[lanes.offsets[lane] + t / 16]);
        ss.push_back(t % 16);
        ++k;
      }
      ctx.Expect(
          k == want && new_tokens[lane] == want && new_blocks[lane] == (want + 15) / 16,
          Str(StorageFormatName(f), " lane ", lane, ": kept ", k, " reported ", new_tokens[lane]));
      for (int32_t t = n - window; t < n; ++t) {
        ctx.Expect(keep[static_cast<size_t>(lane) * lanes.max_tokens + t] == 1,
                   "window tokens are kept");
      }
      kept_tokens.push_back(k);
    }
    const LaneSpec fresh = MakeLanes(l, kept_tokens, 0, rng);
    fresh.Rows(&db, &ds);
    std::vector<uint8_t> fresh_arena(static_cast<size_t>(fresh.num_blocks) * l.block_bytes, 0);
    std::vector<uint8_t> src = arena;
    GatherArgs g;
    g.src = PagedArena{src.data(), l, lanes.num_blocks};
    g.dst = PagedArena{fresh_arena.data(), l, fresh.num_blocks};
    g.num_rows = static_cast<int32_t>(sb.size());
    g.src_blocks = sb.data();
    g.src_slots = ss.data();
    g.dst_blocks = db.data();
    g.dst_slots = ds.data();
    if (!ctx.ExpectOk(ctx.reference->Gather(g, StreamHandle{}), "reference Gather")) return;
    std::vector<float> want(static_cast<size_t>(L) * G * d);
    DecodeAttentionArgs da;
    da.arena = g.dst;
    da.lanes =
        LaneTable{L, fresh.offsets.data(), fresh.ids.data(), fresh.tokens.data(), fresh.max_tokens};
    da.group_size = G;
    da.dtype = DType::kF32;
    da.queries = qd.data();
    da.out = want.data();
    if (!ctx.ExpectOk(ctx.reference->DecodeAttention(da, StreamHandle{}),
                      "reference DecodeAttention"))
      return;
    ctx.Expect(Nmse(want, got) < 1e-9,
               Str(StorageFormatName(f), ": compacted attention NMSE ", Nmse(want, got)));
  }
}

}  // namespace
}  // namespace kvc::kernels::testing
