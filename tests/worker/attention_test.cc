// Blocked attention (sgemm + threaded softmax) against the scalar reference, including gaps in
// positions, per-head token sets and queries that see nothing.
#include "worker/engine/attention.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kvc::worker {
namespace {

struct Case {
  std::vector<int32_t> positions;
  std::vector<float> keys, values;
};

Case RandomHead(std::mt19937& rng, int64_t tokens, int32_t hd) {
  std::normal_distribution<float> normal;
  Case c;
  int32_t pos = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    pos += 1 + static_cast<int32_t>(rng() % 3);  // gaps, as after eviction
    c.positions.push_back(pos);
  }
  for (int64_t i = 0; i < tokens * hd; ++i) {
    c.keys.push_back(normal(rng));
    c.values.push_back(normal(rng));
  }
  return c;
}

TEST(AttentionTest, BlockedMatchesReference) {
  SCOPED_TRACE("seed 7");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const KvGeometry g{1, 2, 6, 16};
  kernels::ThreadPool pool(2);
  for (int64_t tokens : {1, 5, 200}) {
    std::vector<Case> heads = {RandomHead(rng, tokens, g.head_dim),
                               RandomHead(rng, tokens + 3, g.head_dim)};
    // Query positions span "before every key" to "after every key".
    const std::vector<int32_t> qpos = {0, 1, 7, 150, 1000};
    std::vector<float> q(qpos.size() * g.num_q_heads * g.head_dim);
    for (float& x : q) x = normal(rng);
    std::vector<float> fast(q.size(), -1.0f), ref(q.size(), -1.0f);
    for (int32_t h = 0; h < g.num_kv_heads; ++h) {
      HeadKvView v{heads[h].positions.data(), heads[h].keys.data(), heads[h].values.data(),
                   static_cast<int64_t>(heads[h].positions.size())};
      AttendKvHead(g, h, v, q, qpos, absl::MakeSpan(fast), &pool);
      AttendReference(g, h, v, q, qpos, absl::MakeSpan(ref));
    }
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(fast[i], ref[i], 2e-5) << "i=" << i;
    // Position 0 precedes every stored key (they start at >= 1): output must be zeros.
    for (int i = 0; i < g.num_q_heads * g.head_dim; ++i) EXPECT_EQ(fast[i], 0.0f);
  }
}

}  // namespace
}  // namespace kvc::worker

namespace kvc::worker {
namespace {

// Attention over committed tokens and over a pending chunk, merged by log-sum-exp, equals
// attention over both at once (how a cache that sees a chunk only after every layer has it
// can still serve the forward pass exactly).
TEST(AttentionTest, MergingDisjointKeySetsEqualsAttendingOverTheUnion) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  const KvGeometry g{1, 2, 6, 16};
  Case all = RandomHead(rng, 40, g.head_dim);
  const int64_t split = 25;  // tokens [0, 25) committed, [25, 40) pending
  const size_t hd = g.head_dim;
  const std::vector<int32_t> qpos = {all.positions[30], all.positions[39], all.positions[3]};
  std::vector<float> q(qpos.size() * g.num_q_heads * hd);
  for (float& x : q) x = normal(rng);
  std::vector<float> whole(q.size()), a(q.size()), b(q.size());
  std::vector<float> lse_a(qpos.size() * g.num_q_heads), lse_b(lse_a.size());
  for (int32_t h = 0; h < g.num_kv_heads; ++h) {  // both kv heads share the rows here
    HeadKvView all_v{all.positions.data(), all.keys.data(), all.values.data(), 40};
    HeadKvView first{all.positions.data(), all.keys.data(), all.values.data(), split};
    HeadKvView second{all.positions.data() + split, all.keys.data() + split * hd,
                      all.values.data() + split * hd, 40 - split};
    AttendKvHead(g, h, all_v, q, qpos, absl::MakeSpan(whole), /*pool=*/nullptr);
    AttendKvHead(g, h, first, q, qpos, absl::MakeSpan(a), /*pool=*/nullptr, absl::MakeSpan(lse_a));
    AttendKvHead(g, h, second, q, qpos, absl::MakeSpan(b), /*pool=*/nullptr, absl::MakeSpan(lse_b));
  }
  MergeAttention(g, absl::MakeSpan(a), absl::MakeSpan(lse_a), b, lse_b);
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(a[i], whole[i], 1e-5) << "i=" << i;
}

}  // namespace
}  // namespace kvc::worker
