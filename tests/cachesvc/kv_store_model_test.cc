// Model-based random test: thousands of random create / append / fetch / get / release
// steps against a KvStore, each checked against a trivial model (std::map of sequence ->
// tokens per layer). KV payloads are a pure function of (seed, layer, head, position), so
// the model needs no bytes and every fetched byte is checked. Seeds are fixed and printed.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cachesvc/core/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::MakeHeadKv;
using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 3, kHeads = 2, kDim = 16, kBlock = 8, kBlocks = 400;

struct ModelSequence {
  uint32_t seed = 0;
  std::vector<int64_t> layer_tokens = std::vector<int64_t>(kLayers, 0);
  int64_t visible() const { return *std::min_element(layer_tokens.begin(), layer_tokens.end()); }
  int64_t blocks() const {
    int64_t n = 0;
    for (int64_t t : layer_tokens) n += kHeads * ((t + kBlock - 1) / kBlock);
    return n;
  }
};

class Model {
 public:
  std::map<std::string, ModelSequence> sequences;
  int64_t used_blocks() const {
    int64_t n = 0;
    for (const auto& [id, s] : sequences) n += s.blocks();
    return n;
  }
};

class KvStoreModelTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(KvStoreModelTest, RandomOperationsMatchTheModel) {
  const uint32_t seed = GetParam();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " (rerun: --gtest_filter=*RandomOperations*/" << seed << ")");
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  PoolOptions pool;
  pool.name = "m";
  pool.geometry = {kLayers, kHeads, kHeads, kDim, kBlock, DType::kF16, {}};
  pool.capacity_bytes =
      kBlocks *
      static_cast<int64_t>(kernels::MakeBlockLayout(StorageFormat::kF16, kDim, kBlock).block_bytes);
  KvStoreOptions options;
  options.pools.push_back(pool);
  options.max_sequences = 12;
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(options));
  Model model;
  uint32_t next_seed = 1;

  auto pick = [&]() -> std::string {
    if (model.sequences.empty() || uniform(0, 9) == 0)
      return "unknown-" + std::to_string(uniform(0, 3));
    auto it = model.sequences.begin();
    std::advance(it, uniform(0, static_cast<int>(model.sequences.size()) - 1));
    return it->first;
  };

  constexpr int kSteps = 2500;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const int op = uniform(0, 99);
    if (op < 10) {  // create
      CreateSequenceParams p;
      if (uniform(0, 2) == 0) p.client_sequence_id = "c" + std::to_string(uniform(0, 15));
      auto r = store->CreateSequence(p);
      if (!p.client_sequence_id.empty() && model.sequences.count(p.client_sequence_id)) {
        ASSERT_THAT(r, StatusIs(Code::kAlreadyExists));
      } else if (static_cast<int>(model.sequences.size()) >= options.max_sequences) {
        ASSERT_THAT(r, StatusIs(Code::kResourceExhausted));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        ASSERT_EQ(model.sequences.count(r->id), 0u);
        model.sequences[r->id].seed = next_seed++;
      }
    } else if (op < 60) {  // append
      const std::string id = pick();
      const int layer = uniform(0, kLayers - 1);
      const int n = uniform(1, 40);
      auto it = model.sequences.find(id);
      const int64_t have = it == model.sequences.end() ? 0 : it->second.layer_tokens[layer];
      const bool misorder = uniform(0, 19) == 0;
      const int64_t start = misorder ? have + uniform(1, 5) : have;
      const uint32_t data_seed = it == model.sequences.end() ? 0 : it->second.seed;
      const std::string k = MakeKv(data_seed, layer, start, n, kHeads, kDim, DType::kF16, false);
      const std::string v = MakeKv(data_seed, layer, start, n, kHeads, kDim, DType::kF16, true);
      AppendParams a;
      a.sequence_id = id;
      a.layer = layer;
      a.start_position = start;
      a.num_tokens = n;
      a.keys = k;
      a.values = v;
      auto r = store->Append(a);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else if (misorder) {
        ASSERT_THAT(r, StatusIs(Code::kFailedPrecondition));
      } else {
        const int64_t grow =
            kHeads * ((have + n + kBlock - 1) / kBlock - (have + kBlock - 1) / kBlock);
        if (grow > kBlocks - model.used_blocks()) {
          ASSERT_THAT(r, StatusIs(Code::kResourceExhausted));
        } else {
          ASSERT_THAT(r, ::kvc::testing::IsOk());
          it->second.layer_tokens[layer] += n;
          ASSERT_EQ(r->visible_tokens, it->second.visible());
        }
      }
    } else if (op < 80) {  // fetch
      const std::string id = pick();
      FetchParams f;
      f.sequence_id = id;
      if (uniform(0, 1) == 0) f.layers = {uniform(0, kLayers - 1)};
      if (uniform(0, 1) == 0) {
        f.dtype = uniform(0, 1) ? DType::kF32 : DType::kBF16;
        f.dtype_set = true;
      }
      f.max_chunk_bytes = uniform(0, 1) ? 4096 : 0;
      std::map<std::pair<int, int>, int64_t> got;  // (layer, head) -> tokens seen
      auto it = model.sequences.find(id);
      const absl::Status st = store->Fetch(f, [&](FetchChunk& c) {
        const uint32_t s = it->second.seed;
        const DType dt = f.dtype_set ? f.dtype : DType::kF16;
        EXPECT_EQ(c.first_index, (got[{c.layer, c.kv_head}]));
        EXPECT_EQ(c.keys,
                  MakeHeadKv(s, c.layer, c.kv_head, c.first_index, c.num_tokens, kDim, dt, false));
        EXPECT_EQ(c.values,
                  MakeHeadKv(s, c.layer, c.kv_head, c.first_index, c.num_tokens, kDim, dt, true));
        for (int i = 0; i < c.num_tokens; ++i) {
          EXPECT_EQ(c.positions[static_cast<size_t>(i)], c.first_index + i);
        }
        got[std::make_pair(c.layer, c.kv_head)] += c.num_tokens;
        return true;
      });
      if (it == model.sequences.end()) {
        ASSERT_THAT(st, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(st, ::kvc::testing::IsOk());
        for (const auto& [key, n] : got) ASSERT_EQ(n, it->second.visible());
        if (it->second.visible() > 0) {
          ASSERT_EQ(got.size(), static_cast<size_t>(f.layers.empty() ? kLayers * kHeads : kHeads));
        }
      }
    } else if (op < 90) {  // get
      const std::string id = pick();
      auto r = store->GetSequence(id);
      auto it = model.sequences.find(id);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        ASSERT_EQ(r->layer_tokens, it->second.layer_tokens);
        ASSERT_EQ(r->visible_tokens, it->second.visible());
        ASSERT_EQ(r->bytes_by_format.at(0).blocks, it->second.blocks());
      }
    } else {  // release
      const std::string id = pick();
      auto r = store->Release(id);
      auto it = model.sequences.find(id);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        ASSERT_EQ(r->freed_blocks, it->second.blocks());
        model.sequences.erase(it);
      }
    }
    KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, store->GetPoolStats("m"));
    ASSERT_EQ(stats.used_blocks, model.used_blocks());
    ASSERT_EQ(stats.sequences, static_cast<int64_t>(model.sequences.size()));
  }
  // Releasing everything returns the pool to empty: no leaked or stranded blocks.
  for (const auto& [id, s] : model.sequences) KVC_ASSERT_OK(store->Release(id));
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, store->GetPoolStats("m"));
  EXPECT_EQ(stats.used_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvStoreModelTest, ::testing::Values(1u, 2u, 3u, 20261129u));

}  // namespace
}  // namespace kvc::cachesvc
