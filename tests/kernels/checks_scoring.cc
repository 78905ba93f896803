// Backend checks of SnapKV scoring, H2O accumulation, selection and compaction, plus spec
// checks of the selection and compaction rules on hand-made inputs.
#include <algorithm>
#include <cmath>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

std::vector<float> LaneScores(const LaneSpec& lanes, const std::vector<uint8_t>& arena) {
  PagedArena a{const_cast<uint8_t*>(arena.data()), lanes.layout, lanes.num_blocks};
  std::vector<int32_t> blocks, slots;
  lanes.Rows(&blocks, &slots);
  std::vector<float> out;
  for (size_t r = 0; r < blocks.size(); ++r) out.push_back(*ScorePtr(a, blocks[r], slots[r]));
  return out;
}

KVC_BACKEND_CHECK(SnapKvMatchesReference) {
  std::mt19937 rng(21);
  struct Case {
    StorageFormat f;
    int d, group, window, kernel;
    PoolKind pool;
    ScoreMode mode;
    std::vector<int32_t> tokens;
  };
  const Case cases[] = {
      {StorageFormat::kF16, 128, 1, 8, 7, PoolKind::kMax, ScoreMode::kOverwrite, {1, 37, 200}},
      {StorageFormat::kInt4G32, 64, 3, 16, 5, PoolKind::kAvg, ScoreMode::kOverwrite, {100, 16}},
      {StorageFormat::kFp8E4M3, 128, 8, 32, 7, PoolKind::kMax, ScoreMode::kAccumulate, {300, 64}},
      {StorageFormat::kNvfp4, 64, 8, 4, 1, PoolKind::kAvg, ScoreMode::kAccumulate, {50}},
      // Many key tiles with a partial last one; the SnapKV/Llama shape (G 4, window 32).
      {StorageFormat::kF16, 128, 4, 32, 7, PoolKind::kMax, ScoreMode::kOverwrite, {3000, 1, 65}},
      // H2O-like long window: the CPU backend splits it over several query chunks; lanes
      // shorter than the window see fully masked queries.
      {StorageFormat::kInt8, 64, 2, 300, 1, PoolKind::kAvg, ScoreMode::kAccumulate, {300, 17}},
  };
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(c.f, c.d, 16);
    const LaneSpec lanes = MakeLanes(l, c.tokens, 1, rng);
    const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, false, rng);
    const int32_t L = lanes.num_lanes();
    const std::vector<float> q =
        RandomRows(static_cast<int64_t>(L) * c.group * c.window, c.d, DataKind::kGaussian, rng);
    const std::vector<uint8_t> qb = ToDType(q, DType::kBF16);
    std::vector<int32_t> qpos;
    for (int32_t lane = 0; lane < L; ++lane) {
      for (int w = 0; w < c.window; ++w) qpos.push_back(lanes.tokens[lane] - c.window + w);
    }
    std::vector<float> scores[2], out[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      const DeviceLanes dl = UploadLanes(s, lanes, arena);
      SnapKvScoreArgs a;
      a.arena = dl.arena;
      a.lanes = dl.table;
      a.group_size = c.group;
      a.window = c.window;
      a.query_dtype = DType::kBF16;
      a.queries = s.Upload(qb);
      a.query_positions = s.Upload(qpos);
      a.pool_kernel = c.kernel;
      a.pool = c.pool;
      a.mode = c.mode;
      a.out_scores = static_cast<float*>(s.Alloc(static_cast<size_t>(L) * lanes.max_tokens * 4));
      if (!ctx.ExpectOk(backends[i]->SnapKvScore(a, StreamHandle{}), "SnapKvScore")) return;
      scores[i] = LaneScores(lanes, s.DownloadBytes(a.arena.base, arena.size()));
      out[i] = s.Download(a.out_scores, static_cast<size_t>(L) * lanes.max_tokens);
    }
    const std::string what =
        Str("snapkv ", ShapeName(l), " G", c.group, " w", c.window, " k", c.kernel);
    ctx.Expect(Nmse(scores[0], scores[1]) < 1e-8,
               Str(what, ": block scores NMSE ", Nmse(scores[0], scores[1])));
    ctx.Expect(Nmse(out[0], out[1]) < 1e-8, Str(what, ": out_scores NMSE ", Nmse(out[0], out[1])));
  }
}

KVC_BACKEND_CHECK(AccumulateScoresMatchesReference) {
  std::mt19937 rng(22);
  const BlockLayout l = MakeBlockLayout(StorageFormat::kInt8, 64, 16);
  const LaneSpec lanes = MakeLanes(l, {1, 90, 17}, 0, rng);
  const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, false, rng);
  const int G = 3;
  std::vector<float> w(static_cast<size_t>(lanes.num_lanes()) * G * lanes.max_tokens);
  std::uniform_real_distribution<float> uni(0, 1);
  for (float& x : w) x = uni(rng);
  std::vector<float> scores[2];
  KernelBackend* backends[2] = {ctx.reference, ctx.backend};
  for (int i = 0; i < 2; ++i) {
    Session s(*backends[i], ctx);
    const DeviceLanes dl = UploadLanes(s, lanes, arena);
    AccumulateScoresArgs a{dl.arena, dl.table, G, s.Upload(w)};
    if (!ctx.ExpectOk(backends[i]->AccumulateScores(a, StreamHandle{}), "AccumulateScores")) return;
    scores[i] = LaneScores(lanes, s.DownloadBytes(a.arena.base, arena.size()));
  }
  ctx.Expect(Nmse(scores[0], scores[1]) < 1e-12, "accumulated scores");
}

// Overwrites block scores with values from `gen` (for ties and NaNs).
template <typename Gen>
void SetScores(const LaneSpec& lanes, std::vector<uint8_t>* arena, Gen gen) {
  PagedArena a{arena->data(), lanes.layout, lanes.num_blocks};
  std::vector<int32_t> blocks, slots;
  lanes.Rows(&blocks, &slots);
  for (size_t r = 0; r < blocks.size(); ++r) *ScorePtr(a, blocks[r], slots[r]) = gen(r);
}

KVC_BACKEND_CHECK(SelectMatchesReference) {
  std::mt19937 rng(23);
  struct Case {
    int sinks, recent, budget;
    bool per_lane, ties;
  };
  const Case cases[] = {{0, 8, 20, false, false},
                        {4, 16, 10, false, true},
                        {2, 0, 0, false, false},
                        {0, 0, 33, true, true},
                        {4, 1020, 100, false, false}};
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(StorageFormat::kF16, 64, 16);
    const LaneSpec lanes = MakeLanes(l, {1, 30, 64, 257, 2000}, 0, rng);
    std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, true, rng);
    if (c.ties) {
      SetScores(lanes, &arena, [&](size_t r) {
        return r % 97 == 5 ? NAN : static_cast<float>(rng() % 4) * 0.25f;
      });
    }
    std::vector<int32_t> budgets;
    for (int32_t lane = 0; lane < lanes.num_lanes(); ++lane)
      budgets.push_back(static_cast<int32_t>(rng() % 50));
    std::vector<uint8_t> keep[2];
    std::vector<int32_t> kept[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      const DeviceLanes dl = UploadLanes(s, lanes, arena);
      SelectArgs a;
      a.arena = dl.arena;
      a.lanes = dl.table;
      a.sinks = c.sinks;
      a.recent = c.recent;
      a.budget = c.budget;
      a.budgets = c.per_lane ? s.Upload(budgets) : nullptr;
      const size_t n = static_cast<size_t>(lanes.num_lanes()) * lanes.max_tokens;
      a.keep = static_cast<uint8_t*>(s.Alloc(n));
      a.kept = static_cast<int32_t*>(s.Alloc(lanes.num_lanes() * 4));
      if (!ctx.ExpectOk(backends[i]->Select(a, StreamHandle{}), "Select")) return;
      keep[i] = s.DownloadBytes(a.keep, n);
      kept[i] = s.Download(a.kept, lanes.num_lanes());
    }
    const std::string what =
        Str("select sinks ", c.sinks, " recent ", c.recent, " budget ", c.budget,
            c.per_lane ? " per-lane" : "", c.ties ? " with ties/NaN" : "");
    ctx.Expect(keep[0] == keep[1], what + ": keep masks identical");
    ctx.Expect(kept[0] == kept[1], what + ": kept counts identical");
  }
  // Only empty lanes (max_tokens 0): nothing to keep, but every lane's count is still
  // written (the caller's buffer holds garbage).
  {
    const BlockLayout l = MakeBlockLayout(StorageFormat::kF16, 64, 16);
    const LaneSpec lanes = MakeLanes(l, {0, 0, 0}, 0, rng);
    std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, true, rng);
    Session s(*ctx.backend, ctx);
    const DeviceLanes dl = UploadLanes(s, lanes, arena);
    SelectArgs a;
    a.arena = dl.arena;
    a.lanes = dl.table;
    a.budget = 4;
    a.keep = static_cast<uint8_t*>(s.Alloc(1));
    a.kept = s.Upload(std::vector<int32_t>(3, -7));
    if (!ctx.ExpectOk(ctx.backend->Select(a, StreamHandle{}), "Select of empty lanes")) return;
    ctx.Expect(s.Download(a.kept, 3) == std::vector<int32_t>(3, 0),
               "select of empty lanes: kept = 0 for every lane");
  }
}

// Spec: hand-checked selection with ties, sinks and recent tokens.
KVC_SPEC_CHECK(SelectRules) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  const BlockLayout l = MakeBlockLayout(StorageFormat::kF16, 16, 4);
  std::vector<uint8_t> arena(3 * l.block_bytes, 0);
  PagedArena a{arena.data(), l, 3};
  // Stored order: positions 9 8 7 6 5 4 3 2 1 0 (reversed), scores chosen to tie.
  const float score[10] = {5, 1, 3, 3, 0, 3, 2, NAN, 9, 9};
  const int32_t ids[3] = {2, 0, 1}, offsets[2] = {0, 3}, tokens[1] = {10};
  for (int t = 0; t < 10; ++t) {
    *PositionPtr(a, ids[t / 4], t % 4) = 9 - t;
    *ScorePtr(a, ids[t / 4], t % 4) = score[t];
  }
  std::vector<uint8_t> keep(10);
  int32_t kept = 0;
  SelectArgs s;
  s.arena = a;
  s.lanes = LaneTable{1, offsets, ids, tokens, 10};
  s.sinks = 1;   // position 0 (stored index 9)
  s.recent = 2;  // positions 9, 8 (stored 0, 1)
  s.budget = 3;  // among the rest: 3 @pos 1 (idx 8); the 3.0 ties at pos 7, 6, 4 -> 4, 6
  s.keep = keep.data();
  s.kept = &kept;
  ctx.ExpectOk(ref->Select(s, StreamHandle{}), "Select");
  // index (position, score): 0 (9, 5) 1 (8, 1) 2 (7, 3) 3 (6, 3) 4 (5, 0) 5 (4, 3) 6 (3, 2)
  // 7 (2, NaN) 8 (1, 9) 9 (0, 9). Sink: 9. Recent: 0, 1. Heavy: 8 (9.0), then the 3.0 ties
  // at positions 7, 6, 4 resolve to the lowest positions: 5 (p4) and 3 (p6).
  const std::vector<uint8_t> want = {1, 1, 0, 1, 0, 1, 0, 0, 1, 1};
  ctx.Expect(keep == want, "kept set follows score, then lowest position");
  ctx.Expect(kept == 6, "kept count");
}

KVC_BACKEND_CHECK(CompactMatchesReference) {
  std::mt19937 rng(24);
  for (StorageFormat f : {StorageFormat::kBF16, StorageFormat::kInt4G64, StorageFormat::kNvfp4}) {
    const BlockLayout l = MakeBlockLayout(f, 128, 16);
    const LaneSpec lanes = MakeLanes(l, {1, 1, 40, 64, 300, 17}, 0, rng);
    const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, true, rng);
    std::vector<uint8_t> keep(static_cast<size_t>(lanes.num_lanes()) * lanes.max_tokens, 0);
    for (int32_t lane = 0; lane < lanes.num_lanes(); ++lane) {
      const int mode = lane % 4;  // 0: drop all, 1: keep all, 2: 30 %, 3: 70 %
      for (int32_t t = 0; t < lanes.tokens[lane]; ++t) {
        keep[static_cast<size_t>(lane) * lanes.max_tokens + t] =
            mode == 1 || (mode >= 2 && static_cast<int>(rng() % 10) < (mode == 2 ? 3 : 7));
      }
    }
    std::vector<uint8_t> out[2];
    std::vector<int32_t> tok[2], nb[2], moved[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      const DeviceLanes dl = UploadLanes(s, lanes, arena);
      CompactArgs c;
      c.arena = dl.arena;
      c.lanes = dl.table;
      c.keep = s.Upload(keep);
      c.new_num_tokens = static_cast<int32_t*>(s.Alloc(lanes.num_lanes() * 4));
      c.new_num_blocks = static_cast<int32_t*>(s.Alloc(lanes.num_lanes() * 4));
      c.moved = static_cast<int32_t*>(s.Alloc(lanes.num_lanes() * 4));
      if (!ctx.ExpectOk(backends[i]->Compact(c, StreamHandle{}), "Compact")) return;
      out[i] = s.DownloadBytes(c.arena.base, arena.size());
      tok[i] = s.Download(c.new_num_tokens, lanes.num_lanes());
      nb[i] = s.Download(c.new_num_blocks, lanes.num_lanes());
      moved[i] = s.Download(c.moved, lanes.num_lanes());
    }
    const std::string what = Str("compact ", StorageFormatName(f));
    ctx.Expect(out[0] == out[1], what + ": arena bytes exact");
    ctx.Expect(tok[0] == tok[1] && nb[0] == nb[1] && moved[0] == moved[1],
               what + ": reported counts");
  }
}

// Spec: after compaction the multiset of (position, K, V, score) equals the kept set and the
// kept tokens fill a prefix; trailing blocks are reported free.
KVC_SPEC_CHECK(CompactKeepsExactlyTheKeptTokens) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  std::mt19937 rng(25);
  const BlockLayout l = MakeBlockLayout(StorageFormat::kInt8, 64, 16);
  const LaneSpec lanes = MakeLanes(l, {100}, 0, rng);
  std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, true, rng);
  PagedArena a{arena.data(), l, lanes.num_blocks};
  std::vector<uint8_t> keep(100);
  for (auto& k : keep) k = rng() % 3 == 0;
  auto token_key = [&](int32_t t) {
    const int32_t b = lanes.ids[t / 16], s = t % 16;
    std::string key(reinterpret_cast<const char*>(KeyRecord(a, b, s)), l.record_bytes);
    key.append(reinterpret_cast<const char*>(ValueRecord(a, b, s)), l.record_bytes);
    key.append(reinterpret_cast<const char*>(PositionPtr(a, b, s)), 4);
    key.append(reinterpret_cast<const char*>(ScorePtr(a, b, s)), 4);
    return key;
  };
  std::vector<std::string> want;
  for (int32_t t = 0; t < 100; ++t) {
    if (keep[t]) want.push_back(token_key(t));
  }
  int32_t nt = 0, nb = 0;
  CompactArgs c;
  c.arena = a;
  c.lanes = LaneTable{1, lanes.offsets.data(), lanes.ids.data(), lanes.tokens.data(), 100};
  c.keep = keep.data();
  c.new_num_tokens = &nt;
  c.new_num_blocks = &nb;
  ctx.ExpectOk(ref->Compact(c, StreamHandle{}), "Compact");
  std::vector<std::string> got;
  for (int32_t t = 0; t < nt; ++t) got.push_back(token_key(t));
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  ctx.Expect(got == want, "kept multiset preserved");
  ctx.Expect(nb == (nt + 15) / 16, "freed blocks follow the new length");
}

}  // namespace
}  // namespace kvc::kernels::testing
