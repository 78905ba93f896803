#include "worker/engine/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "worker/engine/ops.h"

namespace kvc::worker {
namespace {

// Number of stored tokens a query at `pos` may see (positions are sorted).
int64_t VisibleCount(const HeadKvView& kv, int32_t pos) {
  return std::upper_bound(kv.positions, kv.positions + kv.num_tokens, pos) - kv.positions;
}

}  // namespace

void AttendKvHead(const KvGeometry& g, int32_t kv_head, const HeadKvView& kv,
                  absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                  absl::Span<float> out, kernels::ThreadPool* pool, absl::Span<float> lse) {
  const int64_t n = static_cast<int64_t>(query_positions.size());
  const int32_t group = g.group_size();
  const int32_t hd = g.head_dim;
  const int64_t rows = n * group;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int32_t max_pos = *std::max_element(query_positions.begin(), query_positions.end());
  const int64_t t = VisibleCount(kv, max_pos);  // keys no query can see are never touched
  const bool want_lse = !lse.empty();
  auto lse_at = [&](int64_t row) -> float& {
    return lse[(row / group) * g.num_q_heads + kv_head * group + row % group];
  };
  if (t == 0) {
    for (int64_t i = 0; i < n; ++i) {
      for (int32_t j = 0; j < group; ++j) {
        float* o = out.data() + (i * g.num_q_heads + kv_head * group + j) * hd;
        std::fill(o, o + hd, 0.0f);
        if (want_lse) lse_at(i * group + j) = -std::numeric_limits<float>::infinity();
      }
    }
    return;
  }

  // Gather the group's query heads into a dense [n * group, head_dim] matrix (row = token *
  // group + head in group) so one sgemm against K serves the whole GQA group.
  std::vector<float> q(static_cast<size_t>(rows * hd));
  for (int64_t i = 0; i < n; ++i) {
    const float* src = queries.data() + (i * g.num_q_heads + kv_head * group) * hd;
    std::copy(src, src + group * hd, q.data() + i * group * hd);
  }
  std::vector<float> scores(static_cast<size_t>(rows * t));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(t),
              hd, scale, q.data(), hd, kv.keys, hd, 0.0f, scores.data(), static_cast<int>(t));

  auto softmax_rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* s = scores.data() + r * t;
      const int64_t visible = VisibleCount(kv, query_positions[r / group]);
      if (visible == 0) {
        std::fill(s, s + t, 0.0f);
        if (want_lse) lse_at(r) = -std::numeric_limits<float>::infinity();
        continue;
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < visible; ++c) mx = std::max(mx, s[c]);
      float sum = 0.0f;
      for (int64_t c = 0; c < visible; ++c) {
        s[c] = std::exp(s[c] - mx);
        sum += s[c];
      }
      if (want_lse) lse_at(r) = mx + std::log(sum);
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < visible; ++c) s[c] *= inv;
      std::fill(s + visible, s + t, 0.0f);
    }
  };
  if (pool != nullptr && rows * t >= 16384) {
    pool->ParallelFor(rows, GrainPerThread(rows, *pool), softmax_rows);
  } else {
    softmax_rows(0, rows);
  }

  std::vector<float> o(static_cast<size_t>(rows * hd));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), hd,
              static_cast<int>(t), 1.0f, scores.data(), static_cast<int>(t), kv.values, hd, 0.0f,
              o.data(), hd);
  for (int64_t i = 0; i < n; ++i) {
    float* dst = out.data() + (i * g.num_q_heads + kv_head * group) * hd;
    std::copy(o.data() + i * group * hd, o.data() + (i + 1) * group * hd, dst);
  }
}

void AttendReference(const KvGeometry& g, int32_t kv_head, const HeadKvView& kv,
                     absl::Span<const float> queries, absl::Span<const int32_t> query_positions,
                     absl::Span<float> out) {
  const int32_t hd = g.head_dim;
  const int32_t group = g.group_size();
  for (size_t i = 0; i < query_positions.size(); ++i) {
    for (int32_t j = 0; j < group; ++j) {
      const int64_t qh = kv_head * group + j;
      const float* q = queries.data() + (static_cast<int64_t>(i) * g.num_q_heads + qh) * hd;
      float* o = out.data() + (static_cast<int64_t>(i) * g.num_q_heads + qh) * hd;
      std::vector<double> w;
      for (int64_t t = 0; t < kv.num_tokens; ++t) {
        if (kv.positions[t] > query_positions[i]) continue;
        double dot = 0;
        for (int32_t d = 0; d < hd; ++d) dot += double{q[d]} * kv.keys[t * hd + d];
        w.push_back(dot / std::sqrt(static_cast<double>(hd)));
      }
      std::fill(o, o + hd, 0.0f);
      if (w.empty()) continue;
      const double mx = *std::max_element(w.begin(), w.end());
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      size_t k = 0;
      for (int64_t t = 0; t < kv.num_tokens; ++t) {
        if (kv.positions[t] > query_positions[i]) continue;
        const double p = w[k++] / sum;
        for (int32_t d = 0; d < hd; ++d) o[d] += static_cast<float>(p * kv.values[t * hd + d]);
      }
    }
  }
}

void AttendLayer(const KvGeometry& g, const LayerKv& layer, absl::Span<const float> queries,
                 absl::Span<const int32_t> query_positions, absl::Span<float> out,
                 kernels::ThreadPool* pool, absl::Span<float> lse) {
  for (int32_t h = 0; h < g.num_kv_heads; ++h) {
    const HeadKv& head = layer.heads[h];
    HeadKvView view{head.positions.data(), head.keys.data(), head.values.data(),
                    static_cast<int64_t>(head.positions.size())};
    AttendKvHead(g, h, view, queries, query_positions, out, pool, lse);
  }
}

void MergeAttention(const KvGeometry& g, absl::Span<float> out_a, absl::Span<float> lse_a,
                    absl::Span<const float> out_b, absl::Span<const float> lse_b) {
  const int64_t hd = g.head_dim;
  for (size_t r = 0; r < lse_a.size(); ++r) {
    const float la = lse_a[r], lb = lse_b[r];
    const float m = std::max(la, lb);
    if (m == -std::numeric_limits<float>::infinity()) continue;  // neither side saw a token
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float inv = 1.0f / (wa + wb);
    float* a = out_a.data() + static_cast<int64_t>(r) * hd;
    const float* b = out_b.data() + static_cast<int64_t>(r) * hd;
    for (int64_t d = 0; d < hd; ++d) a[d] = (wa * a[d] + wb * b[d]) * inv;
    lse_a[r] = m + std::log(wa + wb);
  }
}

}  // namespace kvc::worker
