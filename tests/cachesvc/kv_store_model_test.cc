// Model-based random test: thousands of random create / append / fetch / get / compress /
// attend / release steps against a KvStore, each checked against a trivial model (std::map
// of sequence -> stored positions per layer). KV payloads are a pure function of (seed,
// layer, head, position), so the model needs no bytes and every fetched byte is checked;
// Attend is checked against dense attention over exactly the positions the model says are
// stored. Half the sequences keep a raw recent residual (a second block list per lane).
// Seeds are fixed and printed.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
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
  // Raw recent residual (0 = none): the newest min(residual, stored) tokens of a lane live in
  // a second block list (same f16 format here, so every byte stays checkable).
  int64_t residual = 0;
  std::vector<int64_t> layer_tokens = std::vector<int64_t>(kLayers, 0);
  // Positions stored per layer (every kv head keeps the same set under StreamingLLM).
  std::vector<std::set<int32_t>> stored = std::vector<std::set<int32_t>>(kLayers);
  int64_t visible() const { return *std::min_element(layer_tokens.begin(), layer_tokens.end()); }
  static int64_t Ceil(int64_t n) { return (n + kBlock - 1) / kBlock; }
  int64_t residual_tokens(int layer) const {
    return std::min<int64_t>(residual, static_cast<int64_t>(stored[layer].size()));
  }
  int64_t layer_blocks(int layer) const {
    const int64_t r = residual_tokens(layer);
    return kHeads * (Ceil(static_cast<int64_t>(stored[layer].size()) - r) + Ceil(r));
  }
  int64_t blocks() const {
    int64_t n = 0;
    for (int l = 0; l < kLayers; ++l) n += layer_blocks(l);
    return n;
  }
  // Blocks an append of n tokens to `layer` adds once it is done (both parts).
  int64_t append_blocks(int layer, int64_t n) const {
    const int64_t s = static_cast<int64_t>(stored[layer].size());
    const int64_t r_before = residual_tokens(layer);
    const int64_t r_after = std::min<int64_t>(residual, s + n);
    return kHeads * (Ceil(s + n - r_after) + Ceil(r_after) - Ceil(s - r_before) - Ceil(r_before));
  }
  // Blocks such an append may hold on top while it runs: with a residual, the residual's
  // blocks that change are copied (copy on write) and new rows land past its end first.
  int64_t append_slack() const { return residual > 0 ? kHeads * (2 * Ceil(residual) + 1) : 0; }
};

float F16(const std::string& bytes, size_t i) {
  uint16_t h;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return kernels::HalfToFloat(h);
}

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
      if (uniform(0, 1) == 0) p.policy.residual_tokens = uniform(1, 20);
      auto r = store->CreateSequence(p);
      if (!p.client_sequence_id.empty() && model.sequences.count(p.client_sequence_id)) {
        ASSERT_THAT(r, StatusIs(Code::kAlreadyExists));
      } else if (static_cast<int>(model.sequences.size()) >= options.max_sequences) {
        ASSERT_THAT(r, StatusIs(Code::kResourceExhausted));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        ASSERT_EQ(model.sequences.count(r->id), 0u);
        model.sequences[r->id].seed = next_seed++;
        model.sequences[r->id].residual = p.policy.residual_tokens;
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
      const std::string k =
          MakeKv(data_seed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/false);
      const std::string v =
          MakeKv(data_seed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/true);
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
        const int64_t free_blocks = kBlocks - model.used_blocks();
        const int64_t need = it->second.append_blocks(layer, n);
        if (need > free_blocks || (need + it->second.append_slack() > free_blocks && !r.ok())) {
          // Full (or too full for the append's transient blocks): nothing changed.
          ASSERT_THAT(r, StatusIs(Code::kResourceExhausted));
        } else {
          ASSERT_THAT(r, ::kvc::testing::IsOk());
          it->second.layer_tokens[layer] += n;
          for (int64_t t = 0; t < n; ++t)
            it->second.stored[layer].insert(static_cast<int32_t>(start + t));
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
      }
      f.max_chunk_bytes = uniform(0, 1) ? 4096 : 0;
      std::map<std::pair<int, int>, int64_t> got;  // (layer, head) -> tokens seen
      auto it = model.sequences.find(id);
      const absl::Status st = store->Fetch(f, [&](FetchChunk& c) {
        const uint32_t s = it->second.seed;
        const DType dt = f.dtype.value_or(DType::kF16);
        EXPECT_EQ(c.first_index, (got[{c.layer, c.kv_head}]));
        const size_t row = kDim * kernels::DTypeSize(dt);
        for (int i = 0; i < c.num_tokens; ++i) {
          const int32_t pos = c.positions[static_cast<size_t>(i)];
          EXPECT_TRUE(it->second.stored[c.layer].count(pos))
              << "position " << pos << " is not stored";
          EXPECT_LT(pos, it->second.visible());
          EXPECT_EQ(c.keys.substr(i * row, row),
                    MakeHeadKv(s, c.layer, c.kv_head, pos, 1, kDim, dt, /*is_value=*/false));
          EXPECT_EQ(c.values.substr(i * row, row),
                    MakeHeadKv(s, c.layer, c.kv_head, pos, 1, kDim, dt, /*is_value=*/true));
        }
        got[std::make_pair(c.layer, c.kv_head)] += c.num_tokens;
        return true;
      });
      if (it == model.sequences.end()) {
        ASSERT_THAT(st, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(st, ::kvc::testing::IsOk());
        for (const auto& [key, n] : got) {
          const auto& stored = it->second.stored[key.first];
          const int64_t expected = std::count_if(
              stored.begin(), stored.end(), [&](int32_t p) { return p < it->second.visible(); });
          ASSERT_EQ(n, expected);
        }
      }
    } else if (op < 84) {  // compress: StreamingLLM with small random sinks and window
      const std::string id = pick();
      CompressParams cp;
      cp.sequence_id = id;
      cp.spec.eviction = CompressionSpec::Eviction::kStreamingLlm;
      cp.spec.sinks = uniform(0, 4);
      cp.spec.window = uniform(1, 60);
      auto r = store->Compress(cp);
      auto it = model.sequences.find(id);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else if (cp.spec.window < it->second.residual) {  // would cut the raw residual
        ASSERT_THAT(r, StatusIs(Code::kInvalidArgument, "tokens raw"));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        for (auto& stored : it->second.stored) {
          std::set<int32_t> kept;
          int i = 0;
          for (int32_t p : stored)
            if (i++ < cp.spec.sinks) kept.insert(p);
          i = 0;
          for (auto p = stored.rbegin(); p != stored.rend() && i < cp.spec.window; ++p, ++i)
            kept.insert(*p);
          stored = kept;
        }
      }
    } else if (op < 88) {  // attend: dense reference over the model's stored positions
      const std::string id = pick();
      auto it = model.sequences.find(id);
      const int layer = uniform(0, kLayers - 1);
      std::vector<float> q(kHeads * kDim);
      for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(uniform(-8, 8)) / 8.0f;
      AttendParams a;
      a.sequence_id = id;
      a.layer = layer;
      a.dtype = DType::kF32;
      a.queries = absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * 4);
      a.positions = {static_cast<int32_t>(
          it == model.sequences.end() ? 0
                                      : std::max<int64_t>(0, it->second.layer_tokens[layer] - 1))};
      auto r = store->Attend(a);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        const float* out = reinterpret_cast<const float*>(r->output.data());
        for (int h = 0; h < kHeads; ++h) {
          std::vector<double> logits, acc(kDim, 0.0);
          std::vector<std::string> vals;
          for (int32_t pos : it->second.stored[layer]) {
            const std::string k = MakeHeadKv(it->second.seed, layer, h, pos, 1, kDim, DType::kF16,
                                             /*is_value=*/false);
            double dot = 0;
            for (int e = 0; e < kDim; ++e)
              dot += double{q[h * kDim + e]} * F16(k, static_cast<size_t>(e));
            logits.push_back(dot / std::sqrt(double{kDim}));
            vals.push_back(MakeHeadKv(it->second.seed, layer, h, pos, 1, kDim, DType::kF16,
                                      /*is_value=*/true));
          }
          if (logits.empty()) continue;  // nothing stored: zeros
          const double mx = *std::max_element(logits.begin(), logits.end());
          double z = 0;
          for (double& x : logits) z += (x = std::exp(x - mx));
          for (size_t t = 0; t < logits.size(); ++t)
            for (int e = 0; e < kDim; ++e)
              acc[e] += logits[t] / z * F16(vals[t], static_cast<size_t>(e));
          for (int e = 0; e < kDim; ++e)
            ASSERT_NEAR(out[h * kDim + e], acc[e], 2e-3) << "head " << h;
        }
      }
    } else if (op < 92) {  // get
      const std::string id = pick();
      auto r = store->GetSequence(id);
      auto it = model.sequences.find(id);
      if (it == model.sequences.end()) {
        ASSERT_THAT(r, StatusIs(Code::kNotFound));
      } else {
        ASSERT_THAT(r, ::kvc::testing::IsOk());
        ASSERT_EQ(r->layer_tokens, it->second.layer_tokens);
        for (int l = 0; l < kLayers; ++l) {
          for (int h = 0; h < kHeads; ++h) {
            ASSERT_EQ(r->stored_tokens[static_cast<size_t>(l * kHeads + h)],
                      static_cast<int64_t>(it->second.stored[l].size()));
          }
        }
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
