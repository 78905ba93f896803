// The engine's RoPE is the kernels' RoPE: a key the engine rotates and one kvcached re-rotates
// (kernels::RopeRotate) must land on the same values, or moved keys drift from fresh ones.
#include "worker/engine/ops.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvc/kernels/rope.h"

namespace kvc::worker {
namespace {

TEST(OpsTest, ApplyRopeMatchesKernelsRopeRotate) {
  constexpr int32_t kHeads = 3, kHeadDim = 64;
  constexpr float kTheta = 100000.0f;
  const std::vector<int32_t> positions = {0, 1, 37, 8191, 1000000, 2000000000};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> x(positions.size() * kHeads * kHeadDim);
  for (float& v : x) v = normal(rng);
  std::vector<float> expect = x;

  ApplyRope(x.data(), positions, kHeads, kHeadDim, kTheta);
  kernels::RopeConfig rope;
  rope.theta = kTheta;
  rope.style = kernels::RopeStyle::kNeox;  // rotate-half, the engine's layout
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int32_t h = 0; h < kHeads; ++h) {
      kernels::RopeRotate(rope, kHeadDim, positions[t],
                          expect.data() + (t * kHeads + h) * kHeadDim);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(x[i], expect[i]) << "i=" << i;
}

}  // namespace
}  // namespace kvc::worker
