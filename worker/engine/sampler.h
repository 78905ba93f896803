// Next-token choice from logits: greedy (temperature 0) or temperature + top-k + top-p sampling
// with a seeded generator, so a run is reproducible.
#pragma once

#include <cstdint>
#include <random>

#include "absl/types/span.h"

namespace kvc::worker {

struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 40;        // <= 0: no limit
  float top_p = 0.95f;       // 1: no limit
  uint64_t seed = 42;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {}

  // Picks a token id from logits [vocab]. Ties in greedy mode go to the lowest id.
  int32_t Sample(absl::Span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties).
int32_t ArgMax(absl::Span<const float> logits);

}  // namespace kvc::worker
