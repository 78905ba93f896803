// Model-based random test: thousands of random create / append / fetch / get / compress /
// attend / release steps against a KvStore, each checked against the model in
// kv_store_model.h (shared with tests/fuzz/op_sequence_fuzzer, which drives the same steps
// from fuzzer bytes). Seeds are fixed and printed.
#include "tests/cachesvc/kv_store_model.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

class KvStoreModelTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(KvStoreModelTest, RandomOperationsMatchTheModel) {
  const uint32_t seed = GetParam();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " (rerun: --gtest_filter=*RandomOperations*/" << seed << ")");
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  KVC_ASSERT_OK_AND_ASSIGN(auto runner, model::ModelRunner::Create(uniform));

  constexpr int kSteps = 2500;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    KVC_ASSERT_OK(runner->Step());
  }
  // Releasing everything returns the pool to empty: no leaked or stranded blocks.
  KVC_ASSERT_OK(runner->ReleaseAll());
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvStoreModelTest, ::testing::Values(1u, 2u, 3u, 20261129u));

}  // namespace
}  // namespace kvc::cachesvc
