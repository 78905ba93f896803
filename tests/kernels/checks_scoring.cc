// Backend checks of SnapKV and Expected Attention scoring, H2O accumulation and selection, plus
// spec checks of Expected Attention and of the selection rules on hand-made inputs. Positions and
// scores are the caller's arrays [lanes, max_tokens]; max_tokens is padded past the longest lane so
// that every check also sees that slots past a lane's tokens are left alone (keep: written 0).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

void ExpectPaddingUntouched(CheckContext& ctx, const std::string& what, const LaneSpec& lanes,
                            const std::vector<float>& before, const std::vector<float>& got) {
  const int64_t slot = FirstTouchedPadding(lanes, before.data(), got.data(), sizeof(float));
  ctx.Expect(slot < 0, Str(what, ": slot ", slot, " past its lane's tokens was written"));
}

KVC_BACKEND_CHECK(SnapKvMatchesReference) {
  std::mt19937 rng(21);
  struct Case {
    StorageFormat f;
    int d, group, window, kernel;
    PoolKind pool;
    ScoreMode mode;
    std::vector<int32_t> tokens;
    bool shuffle = false;  // key positions not in stored order (a compacted lane)
  };
  const Case cases[] = {
      {StorageFormat::kF16, 128, 1, 8, 7, PoolKind::kMax, ScoreMode::kOverwrite, {1, 37, 200}},
      {StorageFormat::kInt4G32, 64, 3, 16, 5, PoolKind::kAvg, ScoreMode::kOverwrite, {100, 16}},
      {StorageFormat::kFp8E4M3, 128, 8, 32, 7, PoolKind::kMax, ScoreMode::kAccumulate, {300, 64}},
      {StorageFormat::kNvfp4, 64, 8, 4, 1, PoolKind::kAvg, ScoreMode::kAccumulate, {50}, true},
      // Many key tiles with a partial last one; the SnapKV/Llama shape (G 4, window 32).
      {StorageFormat::kF16, 128, 4, 32, 7, PoolKind::kMax, ScoreMode::kOverwrite, {3000, 1, 65}},
      // H2O-like long window: the CPU backend splits it over several query chunks; lanes
      // shorter than the window see fully masked queries.
      {StorageFormat::kInt8, 64, 2, 300, 1, PoolKind::kAvg, ScoreMode::kAccumulate, {300, 17}},
      // Shuffled key positions: the causal mask follows positions, not stored order.
      {StorageFormat::kBF16, 64, 2, 16, 3, PoolKind::kMax, ScoreMode::kOverwrite, {90, 33}, true},
  };
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(c.f, c.d, 16);
    LaneSpec lanes = MakeLanes(l, c.tokens, 1, rng);
    lanes.max_tokens += 5;
    const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
    const std::vector<int32_t> kpos = MakePositions(lanes, c.shuffle, rng);
    const std::vector<float> init = MakeScores(lanes, rng);
    const int32_t num_lanes = lanes.num_lanes();
    const std::vector<float> q = RandomRows(static_cast<int64_t>(num_lanes) * c.group * c.window,
                                            c.d, DataKind::kGaussian, rng);
    const std::vector<uint8_t> qb = ToDType(q, DType::kBF16);
    std::vector<int32_t> qpos;
    for (int32_t lane = 0; lane < num_lanes; ++lane) {
      for (int w = 0; w < c.window; ++w) qpos.push_back(lanes.tokens[lane] - c.window + w);
    }
    std::vector<float> scores[2];
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
      a.key_positions = s.Upload(kpos);
      a.pool_kernel = c.kernel;
      a.pool = c.pool;
      a.mode = c.mode;
      a.scores = s.Upload(init);
      if (!ctx.ExpectOk(backends[i]->SnapKvScore(a, StreamHandle{}), "SnapKvScore")) return;
      scores[i] = s.Download(a.scores, init.size());
      ctx.Expect(s.DownloadBytes(a.arena.base, arena.size()) == arena,
                 "SnapKvScore leaves the arena as it is");
    }
    const std::string what =
        Str("snapkv ", ShapeName(l), " G", c.group, " w", c.window, " k", c.kernel);
    const std::vector<float> want = StoredValues(lanes, scores[0]);
    const std::vector<float> got = StoredValues(lanes, scores[1]);
    ctx.Expect(Nmse(want, got) < 1e-8, Str(what, ": scores NMSE ", Nmse(want, got)));
    ExpectPaddingUntouched(ctx, what, lanes, init, scores[1]);
    ExpectPaddingUntouched(ctx, what + " (reference)", lanes, init, scores[0]);
  }
}

// Query statistics for Expected Attention, per (lane, query head): means N(0, 0.25) and
// symmetric positive semi-definite covariances 0.5 B B^T / r, B a Gaussian [d, r] (r 32).
void ExpectedStats(int32_t num_lanes, int group, int d, std::mt19937& rng, std::vector<float>* mean,
                   std::vector<float>* cov) {
  *mean = RandomRows(static_cast<int64_t>(num_lanes) * group, d, DataKind::kGaussian, rng);
  for (float& x : *mean) x *= 0.5f;
  const int r = 32;
  const size_t dd = static_cast<size_t>(d) * d;
  cov->assign(static_cast<size_t>(num_lanes) * group * dd, 0.0f);
  for (int64_t h = 0; h < static_cast<int64_t>(num_lanes) * group; ++h) {
    const std::vector<float> b = RandomRows(d, r, DataKind::kGaussian, rng);
    float* c = cov->data() + h * dd;
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < d; ++j) {
        float acc = 0.0f;
        for (int u = 0; u < r; ++u) acc += b[i * r + u] * b[j * r + u];
        c[i * d + j] = 0.5f * acc / static_cast<float>(r);
      }
    }
  }
}

KVC_BACKEND_CHECK(ExpectedAttentionMatchesReference) {
  std::mt19937 rng(24);
  struct Case {
    int d, group;
    bool cov, value_norm;
    int32_t min_position;
    std::vector<int32_t> tokens;
    int block_tokens = 16;
    bool shuffle = false;  // key positions not in stored order (a compacted lane)
  };
  // Empty lanes, lanes with every token below min_position, lanes shorter and longer than a
  // CUDA tile (16/32 keys) and a CPU item (256), head_dim 48 (the CUDA covariance tiles do not
  // divide it) and 512 (16-key tiles), block_tokens not a power of two.
  const Case cases[] = {
      {128, 1, true, true, 0, {1, 37, 300}},
      {64, 4, true, false, 4, {100, 0, 16, 3}},
      {128, 8, false, true, 4, {270, 64}, 16, true},
      {16, 3, true, true, 2, {45, 5, 0}, 12},
      {48, 2, true, true, 0, {70, 2}, 8, true},
      {256, 2, true, false, 1, {70}},
      {512, 1, true, true, 3, {20, 33}},
      {64, 2, false, false, 0, {1, 2}},
  };
  for (StorageFormat f : AllFormats()) {
    for (const Case& c : cases) {
      if (!FormatSupportsHeadDim(f, c.d)) continue;
      const BlockLayout l = MakeBlockLayout(f, c.d, c.block_tokens);
      LaneSpec lanes = MakeLanes(l, c.tokens, 1, rng);
      lanes.max_tokens += 5;
      const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
      const std::vector<int32_t> kpos = MakePositions(lanes, c.shuffle, rng);
      const std::vector<float> init = MakeScores(lanes, rng);
      const int32_t num_lanes = lanes.num_lanes();
      std::vector<float> mean, cov;
      ExpectedStats(num_lanes, c.group, c.d, rng, &mean, &cov);
      std::vector<float> scores[2];
      KernelBackend* backends[2] = {ctx.reference, ctx.backend};
      for (int i = 0; i < 2; ++i) {
        Session s(*backends[i], ctx);
        const DeviceLanes dl = UploadLanes(s, lanes, arena);
        ExpectedAttentionScoreArgs a;
        a.arena = dl.arena;
        a.lanes = dl.table;
        a.group_size = c.group;
        a.mean = s.Upload(mean);
        a.cov = c.cov ? s.Upload(cov) : nullptr;
        a.key_positions = s.Upload(kpos);
        a.min_position = c.min_position;
        a.value_norm = c.value_norm;
        a.scores = s.Upload(init);
        if (!ctx.ExpectOk(backends[i]->ExpectedAttentionScore(a, StreamHandle{}),
                          "ExpectedAttentionScore"))
          return;
        scores[i] = s.Download(a.scores, init.size());
        ctx.Expect(s.DownloadBytes(a.arena.base, arena.size()) == arena,
                   "ExpectedAttentionScore leaves the arena as it is");
      }
      const std::string what =
          Str("expected attention ", ShapeName(l), " G", c.group, c.cov ? " cov" : "",
              c.value_norm ? " vnorm" : "", " min ", c.min_position);
      const std::vector<float> want = StoredValues(lanes, scores[0]);
      const std::vector<float> got = StoredValues(lanes, scores[1]);
      ctx.Expect(Nmse(want, got) < 1e-8, Str(what, ": scores NMSE ", Nmse(want, got)));
      ExpectPaddingUntouched(ctx, what, lanes, init, scores[1]);
      ExpectPaddingUntouched(ctx, what + " (reference)", lanes, init, scores[0]);
      // Per lane: sinks score exactly 0; without the value norm the rest is a distribution.
      for (int32_t lane = 0; lane < num_lanes; ++lane) {
        const size_t row = static_cast<size_t>(lane) * lanes.max_tokens;
        double sum = 0;
        int32_t in_softmax = 0;
        for (int32_t t = 0; t < lanes.tokens[lane]; ++t) {
          const float x = scores[1][row + t];
          if (kpos[row + t] < c.min_position) {
            ctx.Expect(x == 0.0f,
                       Str(what, ": lane ", lane, " token ", t, " below min_position scores ", x));
          } else {
            ctx.Expect(x >= 0.0f && std::isfinite(x),
                       Str(what, ": lane ", lane, " token ", t, " scores ", x));
            sum += x;
            ++in_softmax;
          }
        }
        if (!c.value_norm && in_softmax > 0) {
          ctx.Expect(std::fabs(sum - 1.0) < 1e-4,
                     Str(what, ": lane ", lane, " scores sum to ", sum, ", want 1"));
        }
      }
    }
  }
}

// Spec: the reference's Expected Attention scores on f32 blocks equal the formula of ops.h
// computed in double with plain loops (a 4-token lane, the first token a sink, two query heads).
KVC_SPEC_CHECK(ExpectedAttentionIsExpectedSoftmax) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  std::mt19937 rng(25);
  const int d = 16, group = 2, n = 4, max_tokens = 6;
  const BlockLayout l = MakeBlockLayout(StorageFormat::kF32, d, 16);
  const LaneSpec lanes = MakeLanes(l, {n}, 0, rng);
  std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kGaussian, rng);
  const PagedArena pa{arena.data(), l, lanes.num_blocks};
  const int32_t pos[max_tokens] = {0, 1, 2, 3, -1, -1};
  std::vector<float> mean, cov;
  ExpectedStats(1, group, d, rng, &mean, &cov);
  cov[3] += 0.25f;  // not symmetric: k^T C k is still what counts
  for (int with_cov = 0; with_cov < 2; ++with_cov) {
    for (int value_norm = 0; value_norm < 2; ++value_norm) {
      std::vector<float> scores(max_tokens, 7.0f);
      ExpectedAttentionScoreArgs a;
      a.arena = pa;
      a.lanes = LaneTable{1, lanes.offsets.data(), lanes.ids.data(), &n, max_tokens};
      a.group_size = group;
      a.mean = mean.data();
      a.cov = with_cov ? cov.data() : nullptr;
      a.key_positions = pos;
      a.min_position = 1;
      a.value_norm = value_norm != 0;
      a.scores = scores.data();
      ctx.ExpectOk(ref->ExpectedAttentionScore(a, StreamHandle{}), "ExpectedAttentionScore");
      // The formula: logit_t = k.mean / sqrt(d) + k^T C k / (2d) over tokens 1..3.
      std::vector<double> want(n, 0.0);
      for (int g = 0; g < group; ++g) {
        std::vector<double> logit(n, 0.0);
        for (int t = 1; t < n; ++t) {
          const uint8_t* k = KeyRecord(pa, lanes.ids[0], t);
          double dot = 0, quad = 0;
          for (int i = 0; i < d; ++i) {
            dot += static_cast<double>(LoadF32(k + 4 * i)) * mean[g * d + i];
            for (int j = 0; j < d; ++j) {
              quad += static_cast<double>(LoadF32(k + 4 * i)) * cov[(g * d + i) * d + j] *
                      LoadF32(k + 4 * j);
            }
          }
          logit[t] = dot / std::sqrt(static_cast<double>(d)) + (with_cov ? quad / (2.0 * d) : 0);
        }
        double m = -1e300, sum = 0;
        for (int t = 1; t < n; ++t) m = std::max(m, logit[t]);
        for (int t = 1; t < n; ++t) sum += std::exp(logit[t] - m);
        for (int t = 1; t < n; ++t) want[t] += std::exp(logit[t] - m) / sum / group;
      }
      for (int t = 1; t < n && value_norm; ++t) {
        const uint8_t* v = ValueRecord(pa, lanes.ids[0], t);
        double sq = 0;
        for (int j = 0; j < d; ++j)
          sq += static_cast<double>(LoadF32(v + 4 * j)) * LoadF32(v + 4 * j);
        want[t] *= std::sqrt(sq);
      }
      const std::string what =
          Str("expected attention", with_cov ? " with cov" : "", value_norm ? " with ||v||" : "");
      ctx.Expect(scores[0] == 0.0f, Str(what, ": the sink scores ", scores[0], ", want 0"));
      for (int t = 1; t < n; ++t) {
        ctx.Expect(std::fabs(scores[t] - want[t]) <= 1e-5 * (1.0 + std::fabs(want[t])),
                   Str(what, ": token ", t, " scores ", scores[t], ", want ", want[t]));
      }
      ctx.Expect(scores[4] == 7.0f && scores[5] == 7.0f,
                 Str(what, ": slots past num_tokens are left as they are"));
    }
  }
}

KVC_BACKEND_CHECK(AccumulateScoresMatchesReference) {
  std::mt19937 rng(22);
  const BlockLayout l = MakeBlockLayout(StorageFormat::kInt8, 64, 16);
  for (int pad : {0, 7}) {
    LaneSpec lanes = MakeLanes(l, {1, 90, 17, 0, 600}, 0, rng);
    lanes.max_tokens += pad;
    const int group = 3;
    std::vector<float> w(static_cast<size_t>(lanes.num_lanes()) * group * lanes.max_tokens);
    std::uniform_real_distribution<float> uni(0, 1);
    for (float& x : w) x = uni(rng);
    const std::vector<float> init = MakeScores(lanes, rng);
    std::vector<float> scores[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      AccumulateScoresArgs a;
      a.num_lanes = lanes.num_lanes();
      a.num_tokens = s.Upload(lanes.tokens);
      a.max_tokens = lanes.max_tokens;
      a.group_size = group;
      a.weights = s.Upload(w);
      a.scores = s.Upload(init);
      if (!ctx.ExpectOk(backends[i]->AccumulateScores(a, StreamHandle{}), "AccumulateScores"))
        return;
      scores[i] = s.Download(a.scores, init.size());
    }
    const std::vector<float> want = StoredValues(lanes, scores[0]);
    const std::vector<float> got = StoredValues(lanes, scores[1]);
    ctx.Expect(Nmse(want, got) < 1e-12, Str("accumulated scores, pad ", pad));
    ExpectPaddingUntouched(ctx, Str("accumulate, pad ", pad), lanes, init, scores[1]);
    ExpectPaddingUntouched(ctx, Str("accumulate (reference), pad ", pad), lanes, init, scores[0]);
  }
}

KVC_BACKEND_CHECK(SelectMatchesReference) {
  std::mt19937 rng(23);
  struct Case {
    int sinks, recent, budget;
    bool ties;
  };
  const Case cases[] = {{0, 8, 20, false},
                        {4, 16, 10, true},
                        {2, 0, 0, false},
                        {0, 0, 33, true},
                        {4, 1020, 100, false}};
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(StorageFormat::kF16, 64, 16);
    LaneSpec lanes = MakeLanes(l, {1, 30, 64, 257, 2000, 0}, 0, rng);
    lanes.max_tokens += 3;
    const std::vector<int32_t> pos = MakePositions(lanes, /*shuffle=*/true, rng);
    std::vector<float> scores = MakeScores(lanes, rng);
    if (c.ties) {
      for (size_t i = 0; i < scores.size(); ++i)
        scores[i] = i % 97 == 5 ? NAN : static_cast<float>(rng() % 4) * 0.25f;
    }
    const size_t n = static_cast<size_t>(lanes.num_lanes()) * lanes.max_tokens;
    const std::vector<uint8_t> garbage(n, 0xcd);
    std::vector<uint8_t> keep[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      SelectArgs a;
      a.num_lanes = lanes.num_lanes();
      a.num_tokens = s.Upload(lanes.tokens);
      a.max_tokens = lanes.max_tokens;
      a.positions = s.Upload(pos);
      a.scores = s.Upload(scores);
      a.sinks = c.sinks;
      a.recent = c.recent;
      a.budget = c.budget;
      a.keep = s.Upload(garbage);
      if (!ctx.ExpectOk(backends[i]->Select(a, StreamHandle{}), "Select")) return;
      keep[i] = s.DownloadBytes(a.keep, n);
    }
    const std::string what = Str("select sinks ", c.sinks, " recent ", c.recent, " budget ",
                                 c.budget, c.ties ? " with ties/NaN" : "");
    ctx.Expect(keep[0] == keep[1], what + ": keep masks identical");
    for (int32_t lane = 0; lane < lanes.num_lanes(); ++lane) {
      const uint8_t* k = &keep[1][static_cast<size_t>(lane) * lanes.max_tokens];
      const int32_t tokens = lanes.tokens[lane];
      const int64_t kept = std::count(k, k + tokens, 1);
      const int64_t want = std::min<int64_t>(tokens, c.sinks + c.recent + c.budget);
      ctx.Expect(kept == want, Str(what, ": lane ", lane, " keeps ", kept, ", want ", want));
      ctx.Expect(std::all_of(k + tokens, k + lanes.max_tokens, [](uint8_t x) { return x == 0; }),
                 Str(what, ": lane ", lane, " keep past its tokens is 0"));
    }
  }
  // Only empty lanes (max_tokens 0): nothing to read or write.
  {
    Session s(*ctx.backend, ctx);
    const std::vector<int32_t> tokens(3, 0);
    SelectArgs a;
    a.num_lanes = 3;
    a.num_tokens = s.Upload(tokens);
    a.max_tokens = 0;
    a.positions = static_cast<int32_t*>(s.Alloc(4));
    a.scores = static_cast<float*>(s.Alloc(4));
    a.budget = 4;
    a.keep = static_cast<uint8_t*>(s.Alloc(1));
    ctx.ExpectOk(ctx.backend->Select(a, StreamHandle{}), "Select of empty lanes");
  }
}

// AllocateBudgets against the reference, then Select with those budgets: every group's
// budgets add up to its total (or to all its candidates), and the tokens kept over the group
// are the best candidates over all its lanes.
KVC_BACKEND_CHECK(AllocateBudgetsMatchesReference) {
  std::mt19937 rng(29);
  struct Case {
    int sinks, recent, floor, group_lanes;
    std::vector<int32_t> totals;
    bool ties;
  };
  const Case cases[] = {{0, 8, 0, 3, {60, 0}, false},
                        {4, 16, 5, 3, {40, 9}, true},
                        {2, 0, 0, 2, {1, 7, 1000}, false},
                        {0, 0, 100, 6, {50}, false},
                        {4, 64, 10, 1, {20, 3, 0, 5, 500, -4}, true},
                        {1, 1, 0, 6, {-1}, true}};
  for (const Case& c : cases) {
    const BlockLayout l = MakeBlockLayout(StorageFormat::kF16, 64, 16);
    LaneSpec lanes = MakeLanes(l, {1, 30, 64, 257, 200, 0}, 0, rng);
    lanes.max_tokens += 3;
    const std::vector<int32_t> pos = MakePositions(lanes, /*shuffle=*/true, rng);
    std::vector<float> scores = MakeScores(lanes, rng);
    if (c.ties) {
      for (size_t i = 0; i < scores.size(); ++i)
        scores[i] = i % 97 == 5 ? NAN : static_cast<float>(rng() % 4) * 0.25f;
    }
    const int32_t num_lanes = lanes.num_lanes();
    const std::vector<int32_t> garbage(static_cast<size_t>(num_lanes), -7);
    const size_t n = static_cast<size_t>(num_lanes) * lanes.max_tokens;
    std::vector<int32_t> budgets[2];
    std::vector<uint8_t> keep[2];
    KernelBackend* backends[2] = {ctx.reference, ctx.backend};
    for (int i = 0; i < 2; ++i) {
      Session s(*backends[i], ctx);
      AllocateBudgetsArgs a;
      a.num_lanes = num_lanes;
      a.num_tokens = s.Upload(lanes.tokens);
      a.max_tokens = lanes.max_tokens;
      a.positions = s.Upload(pos);
      a.scores = s.Upload(scores);
      a.sinks = c.sinks;
      a.recent = c.recent;
      a.group_lanes = c.group_lanes;
      a.totals = s.Upload(c.totals);
      a.floor = c.floor;
      a.budgets = s.Upload(garbage);
      if (!ctx.ExpectOk(backends[i]->AllocateBudgets(a, StreamHandle{}), "AllocateBudgets")) return;
      budgets[i] = s.Download(a.budgets, static_cast<size_t>(num_lanes));
      SelectArgs sel;
      sel.num_lanes = num_lanes;
      sel.num_tokens = a.num_tokens;
      sel.max_tokens = lanes.max_tokens;
      sel.positions = a.positions;
      sel.scores = a.scores;
      sel.sinks = c.sinks;
      sel.recent = c.recent;
      sel.budget = 1000000;  // ignored: budgets wins
      sel.budgets = a.budgets;
      sel.keep = s.Upload(std::vector<uint8_t>(n, 0xcd));
      if (!ctx.ExpectOk(backends[i]->Select(sel, StreamHandle{}), "Select with budgets")) return;
      keep[i] = s.DownloadBytes(sel.keep, n);
    }
    const std::string what = Str("budgets sinks ", c.sinks, " recent ", c.recent, " floor ",
                                 c.floor, " group ", c.group_lanes, c.ties ? " with ties/NaN" : "");
    ctx.Expect(budgets[0] == budgets[1], what + ": budgets identical");
    ctx.Expect(keep[0] == keep[1], what + ": kept sets identical");
    for (int32_t g = 0; g < num_lanes / c.group_lanes; ++g) {
      int64_t sum = 0, candidates = 0, floors = 0;
      for (int32_t lane = g * c.group_lanes; lane < (g + 1) * c.group_lanes; ++lane) {
        const int64_t cand = std::max<int64_t>(
            0, lanes.tokens[lane] - std::min(c.sinks, lanes.tokens[lane]) - c.recent);
        const int32_t b = budgets[1][static_cast<size_t>(lane)];
        ctx.Expect(b >= std::min<int64_t>(c.floor, cand) && b <= cand,
                   Str(what, ": lane ", lane, " budget ", b, " within [floor, ", cand, "]"));
        sum += b;
        candidates += cand;
        floors += std::min<int64_t>(c.floor, cand);
      }
      const int64_t total = std::max(0, c.totals[static_cast<size_t>(g)]);
      const int64_t want = std::min(std::max(total, floors), candidates);
      ctx.Expect(sum == want, Str(what, ": group ", g, " budgets sum to ", sum, ", want ", want));
    }
  }
}

// Spec: a concentrated head gives its budget to a diffuse one; the floor still holds.
KVC_SPEC_CHECK(AllocateBudgetsRules) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  // Two lanes of 8 tokens (positions 0..7). Lane 0 puts its mass on one token, lane 1
  // spreads it. sinks 1 (position 0), recent 1 (position 7): candidates are positions 1..6.
  const int32_t pos[16] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7};
  const float score[16] = {9, 0.90f, 0.01f, 0.01f, 0.02f, 0.01f, 0.01f, 9,
                           9, 0.15f, 0.14f, 0.16f, 0.13f, 0.12f, 0.11f, 9};
  const int32_t tokens[2] = {8, 8};
  const int32_t totals[1] = {6};  // 3 per lane if uniform
  int32_t budgets[2] = {-1, -1};
  AllocateBudgetsArgs a;
  a.num_lanes = 2;
  a.num_tokens = tokens;
  a.max_tokens = 8;
  a.positions = pos;
  a.scores = score;
  a.sinks = 1;
  a.recent = 1;
  a.group_lanes = 2;
  a.totals = totals;
  a.budgets = budgets;
  ctx.ExpectOk(ref->AllocateBudgets(a, StreamHandle{}), "AllocateBudgets");
  // Best 6 of the pooled candidates: 0.90 (lane 0), then 0.16 0.15 0.14 0.13 0.12 (lane 1).
  ctx.Expect(budgets[0] == 1 && budgets[1] == 5,
             Str("no floor: budgets ", budgets[0], " + ", budgets[1], ", want 1 + 5"));
  a.floor = 2;  // each lane first keeps its 2 best: 0.90 0.02 | 0.16 0.15; then 0.14 0.13
  ctx.ExpectOk(ref->AllocateBudgets(a, StreamHandle{}), "AllocateBudgets with a floor");
  ctx.Expect(budgets[0] == 2 && budgets[1] == 4,
             Str("floor 2: budgets ", budgets[0], " + ", budgets[1], ", want 2 + 4"));
}

// Spec: hand-checked selection with ties, sinks and recent tokens.
KVC_SPEC_CHECK(SelectRules) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  // Stored order: positions 9 8 7 6 5 4 3 2 1 0 (reversed), scores chosen to tie; two slots
  // of padding (max_tokens 12) that must come back 0.
  const int32_t pos[12] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, -5, -6};
  const float score[12] = {5, 1, 3, 3, 0, 3, 2, NAN, 9, 9, 100, 100};
  const int32_t tokens[1] = {10};
  std::vector<uint8_t> keep(12, 7);
  SelectArgs s;
  s.num_lanes = 1;
  s.num_tokens = tokens;
  s.max_tokens = 12;
  s.positions = pos;
  s.scores = score;
  s.sinks = 1;   // position 0 (stored index 9)
  s.recent = 2;  // positions 9, 8 (stored 0, 1)
  s.budget = 3;  // among the rest: 3 @pos 1 (idx 8); the 3.0 ties at pos 7, 6, 4 -> 4, 6
  s.keep = keep.data();
  ctx.ExpectOk(ref->Select(s, StreamHandle{}), "Select");
  // index (position, score): 0 (9, 5) 1 (8, 1) 2 (7, 3) 3 (6, 3) 4 (5, 0) 5 (4, 3) 6 (3, 2)
  // 7 (2, NaN) 8 (1, 9) 9 (0, 9). Sink: 9. Recent: 0, 1. Heavy: 8 (9.0), then the 3.0 ties
  // at positions 7, 6, 4 resolve to the lowest positions: 5 (p4) and 3 (p6).
  const std::vector<uint8_t> want = {1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0};
  ctx.Expect(keep == want, "kept set follows score, then lowest position; padding 0");
  // Equal positions (a caller's duplicate metadata): the lower stored index wins.
  const int32_t same_pos[4] = {3, 3, 3, 3};
  const float same_score[4] = {1, 2, 2, 2};
  const int32_t four[1] = {4};
  std::vector<uint8_t> keep4(4, 7);
  SelectArgs d;
  d.num_lanes = 1;
  d.num_tokens = four;
  d.max_tokens = 4;
  d.positions = same_pos;
  d.scores = same_score;
  d.budget = 2;
  d.keep = keep4.data();
  ctx.ExpectOk(ref->Select(d, StreamHandle{}), "Select with equal positions");
  ctx.Expect(keep4 == std::vector<uint8_t>({0, 1, 1, 0}), "ties on position: lowest index");
}

}  // namespace
}  // namespace kvc::kernels::testing
