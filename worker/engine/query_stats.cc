#include "worker/engine/query_stats.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/engine/ops.h"

namespace kvc::worker {

QueryStatsAccumulator::QueryStatsAccumulator(const KvGeometry& geometry, bool covariance)
    : geometry_(geometry),
      covariance_(covariance),
      layers_(static_cast<size_t>(std::max(geometry.num_layers, 0))) {}

absl::Status QueryStatsAccumulator::Add(int32_t layer, absl::Span<const float> queries,
                                        absl::Span<const int32_t> positions, int32_t begin,
                                        int32_t end) {
  const KvGeometry& g = geometry_;
  if (layer < 0 || layer >= g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("query statistics of layer ", layer));
  }
  const size_t d = static_cast<size_t>(g.head_dim);
  const size_t heads = static_cast<size_t>(g.num_q_heads);
  const size_t row = heads * d;
  if (queries.size() != positions.size() * row || d % 2 != 0) {
    return absl::InvalidArgumentError("query statistics: queries are not [n, q heads, head_dim]");
  }
  if (!(g.rope_theta > 0)) {
    return absl::FailedPreconditionError(
        "query statistics need the RoPE base (KvGeometry::rope_theta) to undo RoPE");
  }
  // The queries inside [begin, end), each rotated back by its own position.
  std::vector<int32_t> kept;
  std::vector<size_t> rows;
  for (size_t t = 0; t < positions.size(); ++t) {
    if (positions[t] >= begin && positions[t] < end) {
      kept.push_back(positions[t]);
      rows.push_back(t);
    }
  }
  if (kept.empty()) return absl::OkStatus();
  const RopeAngles angles = ComputeRopeAngles(kept, g.head_dim, g.rope_theta);
  const size_t half = d / 2;
  Layer& s = layers_[static_cast<size_t>(layer)];
  if (s.sum.empty()) {
    s.shift.assign(row, 0.0);
    s.sum.assign(row, 0.0);
    if (covariance_) s.outer.assign(heads * d * d, 0.0);
  }
  std::vector<double> x(d);
  for (size_t k = 0; k < kept.size(); ++k) {
    const float* sin_t = angles.sin.data() + k * half;
    const float* cos_t = angles.cos.data() + k * half;
    const bool first = s.n == 0;
    for (size_t h = 0; h < heads; ++h) {
      const float* q = queries.data() + rows[k] * row + h * d;
      // ApplyRope: (a, b) -> (a c - b s, b c + a s); its inverse is the transpose.
      for (size_t i = 0; i < half; ++i) {
        const double a = q[i], b = q[i + half], c = cos_t[i], sn = sin_t[i];
        x[i] = a * c + b * sn;
        x[i + half] = b * c - a * sn;
      }
      double* shift = s.shift.data() + h * d;
      if (first) std::copy(x.begin(), x.end(), shift);
      double* sum = s.sum.data() + h * d;
      for (size_t i = 0; i < d; ++i) {
        x[i] -= shift[i];
        sum[i] += x[i];
      }
      if (!covariance_) continue;
      double* outer = s.outer.data() + h * d * d;
      for (size_t i = 0; i < d; ++i) {
        const double xi = x[i];
        double* out_row = outer + i * d;
        for (size_t j = i; j < d; ++j) out_row[j] += xi * x[j];
      }
    }
    ++s.n;
  }
  return absl::OkStatus();
}

int64_t QueryStatsAccumulator::count(int32_t layer) const {
  if (layer < 0 || layer >= static_cast<int32_t>(layers_.size())) return 0;
  return layers_[static_cast<size_t>(layer)].n;
}

std::vector<QueryStats> QueryStatsAccumulator::Finish() const {
  const size_t d = static_cast<size_t>(geometry_.head_dim);
  const size_t heads = static_cast<size_t>(geometry_.num_q_heads);
  std::vector<QueryStats> out(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& s = layers_[l];
    QueryStats& o = out[l];
    o.count = s.n;
    o.mean.assign(heads * d, 0.0f);
    if (covariance_) o.covariance.assign(heads * d * d, 0.0f);
    if (s.n == 0) continue;
    const double inv = 1.0 / static_cast<double>(s.n);
    std::vector<double> m(d);  // mean of the shifted queries
    for (size_t h = 0; h < heads; ++h) {
      for (size_t i = 0; i < d; ++i) {
        m[i] = s.sum[h * d + i] * inv;
        o.mean[h * d + i] = static_cast<float>(s.shift[h * d + i] + m[i]);
      }
      if (!covariance_) continue;
      // Population covariance: E[(x - shift)(x - shift)^T] - m m^T (a shift leaves it as is).
      const double* outer = s.outer.data() + h * d * d;
      float* cov = o.covariance.data() + h * d * d;
      for (size_t i = 0; i < d; ++i) {
        for (size_t j = i; j < d; ++j) {
          const float c = static_cast<float>(outer[i * d + j] * inv - m[i] * m[j]);
          cov[i * d + j] = c;
          cov[j * d + i] = c;
        }
      }
    }
  }
  return out;
}

}  // namespace kvc::worker
