// The model of kv_store_model_test, shared with tests/fuzz/op_sequence_fuzzer: random
// create / append / fetch / get / compress / attend / release steps against a KvStore, each
// checked against a trivial model (std::map of sequence -> stored positions per layer). KV
// payloads are a pure function of (seed, layer, head, position), so the model needs no
// bytes and every fetched byte is checked; Attend is checked against dense attention over
// exactly the positions the model says are stored. Half the sequences keep a raw recent
// residual (a second block list per lane).
//
// Every choice comes from a Uniform(lo, hi) the caller supplies: a seeded std::mt19937 in the
// test, the fuzzer's input bytes in the fuzzer. A divergence is an INTERNAL status naming the
// step's operation and what differed (no gtest here, so a fuzzer can link it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/store/kv_store.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"

namespace kvc::cachesvc::model {

constexpr int kLayers = 3, kHeads = 2, kDim = 16, kBlock = 8, kBlocks = 400;
constexpr int kMaxSequences = 12;
constexpr char kPool[] = "m";

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

inline float F16(const std::string& bytes, size_t i) {
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

// A KvStore with one small f16 pool and the model next to it.
class ModelRunner {
 public:
  using Uniform = std::function<int(int lo, int hi)>;

  static KvStoreOptions StoreOptions() {
    PoolOptions pool;
    pool.device = testing::TestPoolDevice();
    pool.name = kPool;
    pool.geometry = {kLayers, kHeads, kHeads, kDim, kBlock, DType::kF16, {}};
    pool.capacity_bytes =
        kBlocks * static_cast<int64_t>(
                      kernels::MakeBlockLayout(StorageFormat::kF16, kDim, kBlock).block_bytes);
    KvStoreOptions options;
    options.pools.push_back(pool);
    options.max_sequences = kMaxSequences;
    return options;
  }

  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(Uniform uniform) {
    auto store = KvStore::Create(StoreOptions());
    if (!store.ok()) return store.status();
    return std::unique_ptr<ModelRunner>(new ModelRunner(std::move(uniform), *std::move(store)));
  }

  // One random operation, then the pool's block and sequence counts against the model.
  absl::Status Step() {
    const int op = uniform_(0, 99);
    absl::Status st;
    if (op < 10) {
      st = CreateOp();
    } else if (op < 60) {
      st = AppendOp();
    } else if (op < 80) {
      st = FetchOp();
    } else if (op < 84) {
      st = CompressOp();
    } else if (op < 88) {
      st = AttendOp();
    } else if (op < 92) {
      st = GetOp();
    } else {
      st = ReleaseOp();
    }
    if (!st.ok()) return st;
    return CheckPool();
  }

  // Releasing everything returns the pool to empty: no leaked or stranded blocks.
  absl::Status ReleaseAll() {
    for (const auto& [id, s] : model_.sequences) {
      auto r = store_->Release(id);
      if (!r.ok()) return Diverged("release all", r.status(), "OK");
    }
    model_.sequences.clear();
    return CheckPool();
  }

  const Model& model() const { return model_; }

 private:
  ModelRunner(Uniform uniform, std::unique_ptr<KvStore> store)
      : uniform_(std::move(uniform)), store_(std::move(store)) {}

  static absl::Status Fail(const std::string& op, const std::string& what) {
    return absl::InternalError(op + ": " + what);
  }
  static absl::Status Diverged(const std::string& op, const absl::Status& got,
                               const std::string& expected) {
    return Fail(op, "got " + got.ToString() + ", the model expects " + expected);
  }
  // `got` must have `code` (and contain `substring`).
  static absl::Status ExpectCode(const std::string& op, const absl::Status& got,
                                 absl::StatusCode code, const std::string& substring = "") {
    if (got.code() == code && std::string(got.message()).find(substring) != std::string::npos) {
      return absl::OkStatus();
    }
    return Diverged(op, got, absl::StatusCodeToString(code) + " \"" + substring + "\"");
  }
  static absl::Status ExpectOk(const std::string& op, const absl::Status& got) {
    return got.ok() ? absl::OkStatus() : Diverged(op, got, "OK");
  }
  template <typename A, typename B>
  static absl::Status ExpectEq(const std::string& op, const char* what, const A& got,
                               const B& expected) {
    if (got == expected) return absl::OkStatus();
    std::ostringstream s;
    s << what << " is " << got << ", the model says " << expected;
    return Fail(op, s.str());
  }

  std::string Pick() {
    if (model_.sequences.empty() || uniform_(0, 9) == 0)
      return "unknown-" + std::to_string(uniform_(0, 3));
    auto it = model_.sequences.begin();
    std::advance(it, uniform_(0, static_cast<int>(model_.sequences.size()) - 1));
    return it->first;
  }

  absl::Status CreateOp() {
    CreateSequenceParams p;
    if (uniform_(0, 2) == 0) p.client_sequence_id = "c" + std::to_string(uniform_(0, 15));
    if (uniform_(0, 1) == 0) p.policy.residual_tokens = uniform_(1, 20);
    auto r = store_->CreateSequence(p);
    if (!p.client_sequence_id.empty() && model_.sequences.count(p.client_sequence_id)) {
      return ExpectCode("create", r.status(), absl::StatusCode::kAlreadyExists);
    }
    if (static_cast<int>(model_.sequences.size()) >= kMaxSequences) {
      return ExpectCode("create", r.status(), absl::StatusCode::kResourceExhausted);
    }
    if (!r.ok()) return Diverged("create", r.status(), "OK");
    if (model_.sequences.count(r->id)) return Fail("create", "id " + r->id + " reused");
    model_.sequences[r->id].seed = next_seed_++;
    model_.sequences[r->id].residual = p.policy.residual_tokens;
    return absl::OkStatus();
  }

  absl::Status AppendOp() {
    const std::string id = Pick();
    const int layer = uniform_(0, kLayers - 1);
    const int n = uniform_(1, 40);
    auto it = model_.sequences.find(id);
    const int64_t have = it == model_.sequences.end() ? 0 : it->second.layer_tokens[layer];
    const bool misorder = uniform_(0, 19) == 0;
    const int64_t start = misorder ? have + uniform_(1, 5) : have;
    const uint32_t data_seed = it == model_.sequences.end() ? 0 : it->second.seed;
    const std::string k = ::kvc::testing::MakeKv(data_seed, layer, start, n, kHeads, kDim,
                                                 DType::kF16, /*is_value=*/false);
    const std::string v = ::kvc::testing::MakeKv(data_seed, layer, start, n, kHeads, kDim,
                                                 DType::kF16, /*is_value=*/true);
    AppendParams a;
    a.sequence_id = id;
    a.layer = layer;
    a.start_position = start;
    a.num_tokens = n;
    a.keys = k;
    a.values = v;
    auto r = store_->Append(a);
    if (it == model_.sequences.end()) {
      return ExpectCode("append", r.status(), absl::StatusCode::kNotFound);
    }
    if (misorder) return ExpectCode("append", r.status(), absl::StatusCode::kFailedPrecondition);
    const int64_t free_blocks = kBlocks - model_.used_blocks();
    const int64_t need = it->second.append_blocks(layer, n);
    if (need > free_blocks || (need + it->second.append_slack() > free_blocks && !r.ok())) {
      // Full (or too full for the append's transient blocks): nothing changed.
      return ExpectCode("append", r.status(), absl::StatusCode::kResourceExhausted);
    }
    if (!r.ok()) return Diverged("append", r.status(), "OK");
    it->second.layer_tokens[layer] += n;
    for (int64_t t = 0; t < n; ++t)
      it->second.stored[layer].insert(static_cast<int32_t>(start + t));
    return ExpectEq("append", "visible_tokens", r->visible_tokens, it->second.visible());
  }

  absl::Status FetchOp() {
    const std::string id = Pick();
    FetchParams f;
    f.sequence_id = id;
    if (uniform_(0, 1) == 0) f.layers = {uniform_(0, kLayers - 1)};
    if (uniform_(0, 1) == 0) f.dtype = uniform_(0, 1) ? DType::kF32 : DType::kBF16;
    f.max_chunk_bytes = uniform_(0, 1) ? 4096 : 0;
    std::map<std::pair<int, int>, int64_t> got;  // (layer, head) -> tokens seen
    auto it = model_.sequences.find(id);
    absl::Status chunk_error;  // the first chunk that differs from the model
    const absl::Status st = store_->Fetch(f, [&](FetchChunk& c) {
      absl::Status e = it == model_.sequences.end()
                           ? Fail("fetch", "a chunk of an unknown sequence")
                           : CheckChunk(it->second, f, c, got[{c.layer, c.kv_head}]);
      if (chunk_error.ok()) chunk_error = e;
      got[std::make_pair(c.layer, c.kv_head)] += c.num_tokens;
      return true;
    });
    if (it == model_.sequences.end()) {
      return ExpectCode("fetch", st, absl::StatusCode::kNotFound);
    }
    if (absl::Status e = ExpectOk("fetch", st); !e.ok()) return e;
    if (!chunk_error.ok()) return chunk_error;
    for (const auto& [key, n] : got) {
      const auto& stored = it->second.stored[key.first];
      const int64_t expected = std::count_if(stored.begin(), stored.end(),
                                             [&](int32_t p) { return p < it->second.visible(); });
      if (absl::Status e = ExpectEq("fetch", "tokens of a (layer, head)", n, expected); !e.ok())
        return e;
    }
    return absl::OkStatus();
  }

  static absl::Status CheckChunk(const ModelSequence& s, const FetchParams& f, const FetchChunk& c,
                                 int64_t seen) {
    const DType dt = f.dtype.value_or(DType::kF16);
    if (absl::Status e = ExpectEq("fetch", "first_index", c.first_index, seen); !e.ok()) return e;
    const size_t row = kDim * kernels::DTypeSize(dt);
    for (int i = 0; i < c.num_tokens; ++i) {
      const int32_t pos = c.positions[static_cast<size_t>(i)];
      if (!s.stored[c.layer].count(pos) || pos >= s.visible()) {
        return Fail("fetch", "position " + std::to_string(pos) + " is not stored and visible");
      }
      if (c.keys.substr(i * row, row) != ::kvc::testing::MakeHeadKv(s.seed, c.layer, c.kv_head, pos,
                                                                    1, kDim, dt,
                                                                    /*is_value=*/false) ||
          c.values.substr(i * row, row) != ::kvc::testing::MakeHeadKv(s.seed, c.layer, c.kv_head,
                                                                      pos, 1, kDim, dt,
                                                                      /*is_value=*/true)) {
        return Fail("fetch", "bytes of position " + std::to_string(pos) + " differ");
      }
    }
    return absl::OkStatus();
  }

  // StreamingLLM with small random sinks and window.
  absl::Status CompressOp() {
    const std::string id = Pick();
    CompressParams cp;
    cp.sequence_id = id;
    cp.spec.eviction = CompressionSpec::Eviction::kStreamingLlm;
    cp.spec.sinks = uniform_(0, 4);
    cp.spec.window = uniform_(1, 60);
    auto r = store_->Compress(cp);
    auto it = model_.sequences.find(id);
    if (it == model_.sequences.end()) {
      return ExpectCode("compress", r.status(), absl::StatusCode::kNotFound);
    }
    if (cp.spec.window < it->second.residual) {  // would cut the raw residual
      return ExpectCode("compress", r.status(), absl::StatusCode::kInvalidArgument, "tokens raw");
    }
    if (!r.ok()) return Diverged("compress", r.status(), "OK");
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
    return absl::OkStatus();
  }

  // Dense reference attention over the model's stored positions.
  absl::Status AttendOp() {
    const std::string id = Pick();
    auto it = model_.sequences.find(id);
    const int layer = uniform_(0, kLayers - 1);
    std::vector<float> q(kHeads * kDim);
    for (float& x : q) x = static_cast<float>(uniform_(-8, 8)) / 8.0f;
    AttendParams a;
    a.sequence_id = id;
    a.layer = layer;
    a.dtype = DType::kF32;
    a.queries = absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * 4);
    a.positions = {static_cast<int32_t>(
        it == model_.sequences.end() ? 0
                                     : std::max<int64_t>(0, it->second.layer_tokens[layer] - 1))};
    auto r = store_->Attend(a);
    if (it == model_.sequences.end()) {
      return ExpectCode("attend", r.status(), absl::StatusCode::kNotFound);
    }
    if (!r.ok()) return Diverged("attend", r.status(), "OK");
    const ModelSequence& s = it->second;
    std::vector<float> out(q.size());
    if (r->output.size() != out.size() * sizeof(float)) return Fail("attend", "output size");
    std::memcpy(out.data(), r->output.data(), r->output.size());
    for (int h = 0; h < kHeads; ++h) {
      std::vector<double> logits, acc(kDim, 0.0);
      std::vector<std::string> vals;
      for (int32_t pos : s.stored[layer]) {
        const std::string k =
            ::kvc::testing::MakeHeadKv(s.seed, layer, h, pos, 1, kDim, DType::kF16,
                                       /*is_value=*/false);
        double dot = 0;
        for (int e = 0; e < kDim; ++e)
          dot += double{q[h * kDim + e]} * F16(k, static_cast<size_t>(e));
        logits.push_back(dot / std::sqrt(double{kDim}));
        vals.push_back(::kvc::testing::MakeHeadKv(s.seed, layer, h, pos, 1, kDim, DType::kF16,
                                                  /*is_value=*/true));
      }
      if (logits.empty()) continue;  // nothing stored: zeros
      const double mx = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (double& x : logits) z += (x = std::exp(x - mx));
      for (size_t t = 0; t < logits.size(); ++t)
        for (int e = 0; e < kDim; ++e)
          acc[e] += logits[t] / z * F16(vals[t], static_cast<size_t>(e));
      for (int e = 0; e < kDim; ++e) {
        if (!(std::abs(out[h * kDim + e] - acc[e]) <= 2e-3)) {
          std::ostringstream m;
          m << "head " << h << " element " << e << " is " << out[h * kDim + e]
            << ", dense attention gives " << acc[e];
          return Fail("attend", m.str());
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status GetOp() {
    const std::string id = Pick();
    auto r = store_->GetSequence(id);
    auto it = model_.sequences.find(id);
    if (it == model_.sequences.end()) {
      return ExpectCode("get", r.status(), absl::StatusCode::kNotFound);
    }
    if (!r.ok()) return Diverged("get", r.status(), "OK");
    const ModelSequence& s = it->second;
    if (r->layer_tokens != s.layer_tokens) return Fail("get", "layer_tokens differ");
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        if (absl::Status e = ExpectEq("get", "stored_tokens",
                                      r->stored_tokens[static_cast<size_t>(l * kHeads + h)],
                                      static_cast<int64_t>(s.stored[l].size()));
            !e.ok())
          return e;
      }
    }
    if (absl::Status e = ExpectEq("get", "visible_tokens", r->visible_tokens, s.visible()); !e.ok())
      return e;
    return ExpectEq("get", "blocks", r->bytes_by_format.at(0).blocks, s.blocks());
  }

  absl::Status ReleaseOp() {
    const std::string id = Pick();
    auto r = store_->Release(id);
    auto it = model_.sequences.find(id);
    if (it == model_.sequences.end()) {
      return ExpectCode("release", r.status(), absl::StatusCode::kNotFound);
    }
    if (!r.ok()) return Diverged("release", r.status(), "OK");
    const int64_t blocks = it->second.blocks();
    model_.sequences.erase(it);
    return ExpectEq("release", "freed_blocks", r->freed_blocks, blocks);
  }

  absl::Status CheckPool() const {
    auto stats = store_->stats().GetPoolStats(kPool);
    if (!stats.ok()) return Diverged("pool stats", stats.status(), "OK");
    if (absl::Status e =
            ExpectEq("pool stats", "used_blocks", stats->used_blocks, model_.used_blocks());
        !e.ok())
      return e;
    return ExpectEq("pool stats", "sequences", stats->sequences,
                    static_cast<int64_t>(model_.sequences.size()));
  }

  Uniform uniform_;
  std::unique_ptr<KvStore> store_;
  Model model_;
  uint32_t next_seed_ = 1;
};

}  // namespace kvc::cachesvc::model
