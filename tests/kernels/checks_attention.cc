// Backend checks of paged decode attention against the reference, and a spec check of the
// reference against dense double-precision attention.
#include <cmath>
#include <random>

#include "check_framework.h"
#include "test_support.h"

namespace kvc::kernels::testing {
namespace {

KVC_BACKEND_CHECK(DecodeAttentionMatchesReference) {
  std::mt19937 rng(31);
  struct Case {
    int d, group;
    DType dtype;
    bool weights;
    std::vector<int32_t> tokens;
    int block_tokens = 16;
    int pad = 0;  // max_tokens past the longest lane
  };
  // Lanes shorter than a CPU tile (32) and a vector, empty lanes, chunk (256) edges, head
  // groups split over register blocks (G 5..12), head_dim with an odd number of 16-float
  // vectors, block_tokens not a power of two, and a group so large (G 64 at d 256) that the
  // CUDA decode needs more than 48 KiB of shared memory per block (opt-in attribute path).
  const Case cases[] = {
      {128, 1, DType::kF32, true, {1, 17, 600}},   {64, 3, DType::kF16, false, {300, 2}},
      {128, 8, DType::kBF16, true, {33, 1030}},    {64, 4, DType::kF16, true, {5, 0, 31, 3}},
      {128, 4, DType::kF16, false, {257, 3, 512}}, {48, 8, DType::kF32, true, {40, 77}, 12},
      {128, 12, DType::kBF16, true, {70}},         {64, 5, DType::kF16, false, {300, 1}},
      {16, 7, DType::kF32, true, {45}, 8, 3},      {128, 1, DType::kF16, true, {2, 513}, 32, 9},
      {256, 2, DType::kF32, false, {100}},         {256, 64, DType::kF16, true, {70, 3}},
  };
  for (StorageFormat f : AllFormats()) {
    for (const Case& c : cases) {
      if (!FormatSupportsHeadDim(f, c.d)) continue;
      const BlockLayout l = MakeBlockLayout(f, c.d, c.block_tokens);
      LaneSpec lanes = MakeLanes(l, c.tokens, 0, rng);
      lanes.max_tokens += c.pad;
      const std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
      const std::vector<float> init = MakeScores(lanes, rng);
      const int32_t num_lanes = lanes.num_lanes();
      const std::vector<uint8_t> q = ToDType(
          RandomRows(static_cast<int64_t>(num_lanes) * c.group, c.d, DataKind::kGaussian, rng),
          c.dtype);
      const size_t out_bytes = static_cast<size_t>(num_lanes) * c.group * c.d * DTypeSize(c.dtype);
      const size_t nw = static_cast<size_t>(num_lanes) * c.group * lanes.max_tokens;
      std::vector<float> out[2], weights[2], scores[2], lse[2];
      KernelBackend* backends[2] = {ctx.reference, ctx.backend};
      for (int i = 0; i < 2; ++i) {
        Session s(*backends[i], ctx);
        const DeviceLanes dl = UploadLanes(s, lanes, arena);
        DecodeAttentionArgs a;
        a.arena = dl.arena;
        a.lanes = dl.table;
        a.group_size = c.group;
        a.dtype = c.dtype;
        a.queries = s.Upload(q);
        a.out = s.Alloc(out_bytes);
        a.weights = c.weights ? static_cast<float*>(s.Alloc(nw * 4)) : nullptr;
        a.scores = c.weights ? s.Upload(init) : nullptr;
        a.lse = static_cast<float*>(s.Alloc(static_cast<size_t>(num_lanes) * c.group * 4));
        if (!ctx.ExpectOk(backends[i]->DecodeAttention(a, StreamHandle{}), "DecodeAttention"))
          return;
        out[i] = DecodeDense(s.DownloadBytes(a.out, out_bytes), c.dtype);
        if (c.weights) weights[i] = s.Download(a.weights, nw);
        lse[i] = s.Download(a.lse, static_cast<size_t>(num_lanes) * c.group);
        if (c.weights) scores[i] = s.Download(a.scores, init.size());
      }
      const std::string what = Str("decode ", ShapeName(l), " G", c.group, " ", DTypeName(c.dtype));
      const double out_tol = c.dtype == DType::kF32 ? 1e-9 : 1e-5;
      ctx.Expect(Nmse(out[0], out[1]) < out_tol, Str(what, ": output NMSE ", Nmse(out[0], out[1])));
      for (size_t r = 0; r < lse[0].size(); ++r) {
        ctx.Expect(lse[0][r] == lse[1][r] ||  // -infinity for an empty lane
                       std::fabs(lse[0][r] - lse[1][r]) <= 1e-4f * (1.0f + std::fabs(lse[0][r])),
                   Str(what, ": lse[", r, "] ", lse[1][r], " vs reference ", lse[0][r]));
      }
      if (c.weights) {
        ctx.Expect(Nmse(weights[0], weights[1]) < 1e-9,
                   Str(what, ": weights NMSE ", Nmse(weights[0], weights[1])));
        const std::vector<float> want = StoredValues(lanes, scores[0]);
        const std::vector<float> got = StoredValues(lanes, scores[1]);
        ctx.Expect(Nmse(want, got) < 1e-10, Str(what, ": scores NMSE ", Nmse(want, got)));
        const int64_t slot = FirstTouchedPadding(lanes, init.data(), scores[1].data(), 4);
        ctx.Expect(slot < 0, Str(what, ": score slot ", slot, " past its lane was written"));
      }
    }
  }
}

// Spec: the reference over f32 blocks equals dense attention computed in double.
KVC_SPEC_CHECK(DecodeAttentionIsSoftmaxAttention) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  std::mt19937 rng(32);
  const int d = 64, group = 2;
  const BlockLayout l = MakeBlockLayout(StorageFormat::kF32, d, 16);
  const LaneSpec lanes = MakeLanes(l, {45}, 0, rng);
  std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
  const std::vector<float> q = RandomRows(group, d, DataKind::kGaussian, rng);
  std::vector<float> out(group * d), w(group * 45), scores(45, 0.5f);
  DecodeAttentionArgs a;
  a.arena = PagedArena{arena.data(), l, lanes.num_blocks};
  a.lanes = LaneTable{1, lanes.offsets.data(), lanes.ids.data(), lanes.tokens.data(), 45};
  a.group_size = group;
  a.dtype = DType::kF32;
  a.queries = q.data();
  a.out = out.data();
  a.weights = w.data();
  a.scores = scores.data();
  std::vector<float> lse(group);
  a.lse = lse.data();
  ctx.ExpectOk(ref->DecodeAttention(a, StreamHandle{}), "DecodeAttention");
  for (int g = 0; g < group; ++g) {
    std::vector<double> logit(45);
    double m = -1e300;
    for (int t = 0; t < 45; ++t) {
      const uint8_t* k = KeyRecord(a.arena, lanes.ids[t / 16], t % 16);
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += static_cast<double>(q[g * d + j]) * LoadF32(k + 4 * j);
      logit[t] = dot / std::sqrt(static_cast<double>(d));
      m = std::max(m, logit[t]);
    }
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - m));
    ctx.Expect(std::fabs(lse[g] - (m + std::log(sum))) < 1e-5,
               Str("lse ", lse[g], " is log sum exp of the logits ", m + std::log(sum)));
    std::vector<float> want(d, 0.0f), got(out.begin() + g * d, out.begin() + (g + 1) * d);
    std::vector<double> acc(d, 0.0);
    for (int t = 0; t < 45; ++t) {
      const uint8_t* v = ValueRecord(a.arena, lanes.ids[t / 16], t % 16);
      for (int j = 0; j < d; ++j) acc[j] += logit[t] / sum * LoadF32(v + 4 * j);
      ctx.Expect(std::fabs(w[g * 45 + t] - logit[t] / sum) < 1e-6,
                 "weights are softmax probabilities");
    }
    if (g == group - 1) {
      for (int t = 0; t < 45; ++t) {
        const float mean = (w[t] + w[45 + t]) / 2;
        ctx.Expect(std::fabs(scores[t] - (0.5f + mean)) < 1e-6f,
                   "scores += the group mean of the weights");
      }
    }
    for (int j = 0; j < d; ++j) want[j] = static_cast<float>(acc[j]);
    ctx.Expect(Nmse(want, got) < 1e-10,
               Str("reference decode vs double attention, NMSE ", Nmse(want, got)));
  }
}

// Spec: attention over a lane split into two token sets, merged by the log-sum-exp outputs,
// equals attention over the whole lane (what the service does for a raw recent residual).
KVC_SPEC_CHECK(DecodeAttentionMergesByLse) {
  std::unique_ptr<KernelBackend> ref;
  if (!ctx.ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &ref), "create"))
    return;
  std::mt19937 rng(33);
  const int d = 64, group = 3, n = 45, split = 32;
  const BlockLayout l = MakeBlockLayout(StorageFormat::kF32, d, 16);
  const LaneSpec lanes = MakeLanes(l, {n}, 0, rng);
  std::vector<uint8_t> arena = MakeArenaBytes(lanes, DataKind::kOutliers, rng);
  const std::vector<float> q = RandomRows(group, d, DataKind::kGaussian, rng);
  const PagedArena pa{arena.data(), l, lanes.num_blocks};
  auto attend = [&](const int32_t* ids, int32_t tokens, std::vector<float>* out,
                    std::vector<float>* lse) {
    out->assign(group * d, 0.0f);
    lse->assign(group, 0.0f);
    const int32_t offsets[2] = {0, (tokens + 15) / 16};
    DecodeAttentionArgs a;
    a.arena = pa;
    a.lanes = LaneTable{1, offsets, ids, &tokens, tokens};
    a.group_size = group;
    a.dtype = DType::kF32;
    a.queries = q.data();
    a.out = out->data();
    a.lse = lse->data();
    ctx.ExpectOk(ref->DecodeAttention(a, StreamHandle{}), "DecodeAttention");
  };
  std::vector<float> whole, whole_lse, o1, l1, o2, l2;
  attend(lanes.ids.data(), n, &whole, &whole_lse);
  attend(lanes.ids.data(), split, &o1, &l1);
  attend(lanes.ids.data() + split / 16, n - split, &o2, &l2);
  std::vector<float> merged(group * d);
  for (int g = 0; g < group; ++g) {
    const float m = std::max(l1[g], l2[g]);
    const float total = m + std::log(std::exp(l1[g] - m) + std::exp(l2[g] - m));
    ctx.Expect(std::fabs(total - whole_lse[g]) < 1e-5,
               Str("merged lse ", total, " vs ", whole_lse[g]));
    for (int j = 0; j < d; ++j) {
      merged[g * d + j] =
          std::exp(l1[g] - total) * o1[g * d + j] + std::exp(l2[g] - total) * o2[g * d + j];
    }
  }
  ctx.Expect(Nmse(whole, merged) < 1e-10,
             Str("merged vs whole attention, NMSE ", Nmse(whole, merged)));
}

}  // namespace
}  // namespace kvc::kernels::testing
