#include "cachesvc/core/plan/query_model.h"

#include <cmath>

#include "kvc/kernels/rope.h"

namespace kvc::cachesvc {
namespace {

// The averaged rotation of one rotary pair: [[c, -s], [s, c]] acting on (x[a], x[b]).
struct PairRotation {
  int a = 0, b = 0;
  double c = 1, s = 0;
};

std::vector<PairRotation> AveragedPairs(const RopeParams& rope, int head_dim, int64_t first,
                                        int count) {
  const int rd = rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
  const double two_pi = 6.283185307179586476925286766559;
  std::vector<PairRotation> pairs(static_cast<size_t>(rd / 2));
  for (int i = 0; i < rd / 2; ++i) {
    PairRotation& r = pairs[static_cast<size_t>(i)];
    kernels::RopePair(rope.style, rd, i, &r.a, &r.b);
    const double f = kernels::RopeInvFrequency(rope.theta, rd, i);
    double c = 0, s = 0;
    for (int k = 0; k < count; ++k) {
      // Reduced mod 2*pi in double, as the kernels' RopeSinCos, so far positions stay exact.
      const double angle = std::fmod(static_cast<double>(first + k) * f, two_pi);
      c += std::cos(angle);
      s += std::sin(angle);
    }
    r.c = c / count;
    r.s = s / count;
  }
  return pairs;
}

// x := R x for one vector of head_dim doubles read with `stride` between elements.
void Rotate(const std::vector<PairRotation>& pairs, double* x, size_t stride) {
  for (const PairRotation& r : pairs) {
    double& xa = x[static_cast<size_t>(r.a) * stride];
    double& xb = x[static_cast<size_t>(r.b) * stride];
    const double a = xa, b = xb;
    xa = r.c * a - r.s * b;
    xb = r.s * a + r.c * b;
  }
}

}  // namespace

QueryModel AverageRope(const RopeParams& rope, int head_dim, int heads, int64_t first, int count,
                       absl::Span<const float> mean, absl::Span<const float> cov) {
  const std::vector<PairRotation> pairs = AveragedPairs(rope, head_dim, first, count);
  const size_t d = static_cast<size_t>(head_dim);
  QueryModel out;
  out.mean.resize(static_cast<size_t>(heads) * d);
  std::vector<double> v(d);
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
    for (size_t i = 0; i < d; ++i) v[i] = mean[h * d + i];
    Rotate(pairs, v.data(), 1);
    for (size_t i = 0; i < d; ++i) out.mean[h * d + i] = static_cast<float>(v[i]);
  }
  if (cov.empty()) return out;
  out.cov.resize(static_cast<size_t>(heads) * d * d);
  std::vector<double> m(d * d);
  for (size_t h = 0; h < static_cast<size_t>(heads); ++h) {
    const float* src = cov.data() + h * d * d;
    for (size_t i = 0; i < d * d; ++i) m[i] = src[i];
    // R cov: rotate every column; then (R cov) R^T: rotate every row.
    for (size_t j = 0; j < d; ++j) Rotate(pairs, m.data() + j, d);
    for (size_t i = 0; i < d; ++i) Rotate(pairs, m.data() + i * d, 1);
    float* dst = out.cov.data() + h * d * d;
    for (size_t i = 0; i < d * d; ++i) dst[i] = static_cast<float>(m[i]);
  }
  return out;
}

}  // namespace kvc::cachesvc
