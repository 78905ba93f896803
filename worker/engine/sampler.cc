#include "worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvc::worker {

int32_t ArgMax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (options_.temperature <= 0.0f) return ArgMax(logits);
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int32_t k = options_.top_k > 0 ? std::min(options_.top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  ids.resize(static_cast<size_t>(k));
  std::vector<double> p(ids.size());
  const double mx = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    p[i] = std::exp((logits[ids[i]] - mx) / options_.temperature);
    sum += p[i];
  }
  // Nucleus: the smallest prefix (by probability) whose mass reaches top_p.
  double mass = 0;
  size_t keep = ids.size();
  for (size_t i = 0; i < ids.size(); ++i) {
    mass += p[i] / sum;
    if (mass >= options_.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<size_t> dist(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep));
  return ids[dist(rng_)];
}

}  // namespace kvc::worker
