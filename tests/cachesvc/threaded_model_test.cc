// Threaded model-based test. Writer threads drive random Append, AppendStream-style prefills
// (every layer in turn), Compress (StreamingLLM, SnapKV, H2O, storage conversion, setting a
// residual), Attend and Release on a handful of sequences of every storage format, with and
// without a raw residual and under every automatic policy; reader threads Fetch them
// (dense f32 / f16 and as stored) all the while. A model keeps every state each sequence
// passed through. Every Fetch must equal one of the states that existed while it ran, or end
// ABORTED (or NOT_FOUND after a Release); every Attend must match dense attention over the
// model's tokens; block accounting is checked against the model's own count.
//
// Expected bytes are derived independently of the service: each token's value is a pure
// function of (layer, head, position), passed through the reference codec of every format
// it was stored in (record_codec.h, the specification).
//
// KVC_THREADED_MODEL_SECONDS sets the duration (default 20 s: four threads on CI's two cores,
// about 50,000 Fetches in a Release build; the tsan test preset gives it 60 s, where each
// operation is some twenty times slower).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cachesvc/core/plan/eviction_rule.h"
#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "kvc/kernels/record_codec.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::KvValue;
using ::kvc::testing::MakeKv;
using Code = absl::StatusCode;
using Eviction = CompressionSpec::Eviction;
using Chain = std::vector<StorageFormat>;

constexpr int kLayers = 2, kHeads = 2, kQHeads = 4, kDim = 64, kBlock = 8, kSlots = 6;
constexpr uint32_t kSeed = 5;
constexpr StorageFormat kRaw = StorageFormat::kF16;
constexpr StorageFormat kFormats[] = {StorageFormat::kF32,     StorageFormat::kF16,
                                      StorageFormat::kBF16,    StorageFormat::kInt8,
                                      StorageFormat::kFp8E4M3, StorageFormat::kInt4G32,
                                      StorageFormat::kInt4G64, StorageFormat::kNvfp4};

// The value a token holds after being stored in each format of `chain` in turn.
std::vector<float> Expected(int layer, int head, int32_t pos, const Chain& chain, bool value,
                            bool stop_before_last = false) {
  std::vector<float> x(kDim);
  for (int e = 0; e < kDim; ++e) x[e] = KvValue(kSeed, layer, head, pos, e, value);
  std::vector<uint8_t> rec(kernels::TokenRecordBytes(StorageFormat::kF32, kDim));
  for (size_t i = 0; i + (stop_before_last ? 1 : 0) < chain.size(); ++i) {
    kernels::QuantizeRecord(chain[i], kDim, x.data(), rec.data());
    kernels::DequantizeRecord(chain[i], kDim, rec.data(), x.data());
  }
  return x;
}

std::string ExpectedRecord(int layer, int head, int32_t pos, const Chain& chain, bool value) {
  const std::vector<float> x = Expected(layer, head, pos, chain, value, /*stop_before_last=*/true);
  std::string rec(kernels::TokenRecordBytes(chain.back(), kDim), '\0');
  kernels::QuantizeRecord(chain.back(), kDim, x.data(), reinterpret_cast<uint8_t*>(rec.data()));
  return rec;
}

// One state a sequence passed through.
struct Version {
  bool released = false;
  std::vector<int64_t> layer_tokens = std::vector<int64_t>(kLayers, 0);
  std::vector<std::map<int32_t, Chain>> lanes =
      std::vector<std::map<int32_t, Chain>>(kLayers * kHeads);
  int64_t visible() const { return *std::min_element(layer_tokens.begin(), layer_tokens.end()); }
};

struct ModelSequence {
  std::mutex writer;  // one writer at a time (the service allows more; the model needs order)
  std::mutex mu;      // guards the fields below
  std::string id;
  std::vector<std::shared_ptr<const Version>> history;
  int64_t first = 0;  // version number of history[0]
  // Writer-only (under `writer`):
  Version now;
  CompressionSpec policy;
  StorageFormat tier0 = kRaw;
  int64_t residual = 0;
  bool has_scores = false;
  bool ever_lossy = false;       // some tier held lossy tokens: no residual can be set any more
  std::vector<std::string> log;  // what the writers did (printed when a check fails)

  int64_t Publish(const Version& v) {
    std::lock_guard<std::mutex> lock(mu);
    history.push_back(std::make_shared<const Version>(v));
    if (history.size() > 256) {
      history.erase(history.begin());
      ++first;
    }
    return first + static_cast<int64_t>(history.size()) - 1;
  }
  int64_t Latest() {
    std::lock_guard<std::mutex> lock(mu);
    return first + static_cast<int64_t>(history.size()) - 1;
  }
};

std::string Mismatch(const std::vector<FetchChunk>& chunks, const struct Version& v, bool stored);
std::string ChainName(const std::vector<StorageFormat>& chain);

struct Stats {
  std::atomic<int64_t> fetches{0}, aborted{0}, mismatches{0}, appends{0}, compresses{0}, attends{0},
      releases{0}, adopted{0};
};

class World {
 public:
  explicit World(uint32_t seed) : seed_(seed) {
    PoolOptions pool;
    pool.device = testing::TestPoolDevice();
    pool.name = "t";
    pool.geometry = {kLayers, kHeads, kQHeads, kDim, kBlock, DType::kF16, {}};
    pool.capacity_bytes = int64_t{256} << 20;
    KvStoreOptions o;
    o.pools.push_back(pool);
    auto store = KvStore::Create(o);
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    for (auto& s : slots_) s = std::make_unique<ModelSequence>();
    std::mt19937 rng(seed);
    for (int i = 0; i < kSlots; ++i) Recreate(*slots_[static_cast<size_t>(i)], rng);
  }

  void Writer(uint32_t seed, std::chrono::steady_clock::time_point end);
  void Reader(uint32_t seed, std::chrono::steady_clock::time_point end);
  void CheckAccounting();
  Stats stats;

 private:
  void Recreate(ModelSequence& s, std::mt19937& rng);
  bool Append(ModelSequence& s, std::mt19937& rng, int layer, int n);
  bool Compress(ModelSequence& s, std::mt19937& rng);
  bool Attend(ModelSequence& s, std::mt19937& rng);
  // Reads the service's current token sets (the writer holds the sequence) for outcomes only
  // scores decide; checks them against what the rule allows.
  bool Adopt(ModelSequence& s, const Version& candidates, const EvictionRule& rule,
             const std::vector<int>& layers);
  void Fail(const std::string& what) {
    stats.mismatches.fetch_add(1);
    std::lock_guard<std::mutex> lock(fail_mu_);
    if (failures_.size() < 5) failures_.push_back(what);
  }
  void Restructure(ModelSequence& s, Version& v);
  void SelfCheck(ModelSequence& s, int op);
  // Writers also read back every state they make (readers check the interleavings).
  bool self_check_ = std::getenv("KVC_THREADED_MODEL_NO_SELFCHECK") == nullptr;

 public:
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(fail_mu_);
    return failures_;
  }

 private:
  uint32_t seed_;
  std::unique_ptr<KvStore> store_;
  std::array<std::unique_ptr<ModelSequence>, kSlots> slots_;
  std::mutex fail_mu_;
  std::vector<std::string> failures_;
  std::atomic<int> next_id_{0};
};

// A number in [lo, max(lo, hi)].
int Uniform(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
}

bool Lossy(StorageFormat f) { return f != kRaw && f != StorageFormat::kF32; }

// After any change of token sets: the newest `residual` tokens of each lane are in the raw
// residual; every older one is in tier 0, in tier 0's format (tokens aging out of the
// residual are converted on the way).
void World::Restructure(ModelSequence& s, Version& v) {
  for (auto& lane : v.lanes) {
    int64_t rank = static_cast<int64_t>(lane.size());
    for (auto& [pos, chain] : lane) {
      --rank;  // 0 = newest
      if (rank >= s.residual && chain.back() != s.tier0) chain.push_back(s.tier0);
    }
  }
}

void World::Recreate(ModelSequence& s, std::mt19937& rng) {
  CreateSequenceParams p;
  const int serial = next_id_.fetch_add(1);
  p.client_sequence_id = "t" + std::to_string(serial);
  // Three tenants share the slots, so their accounts must sum to the pool's use.
  p.tenant = "tenant" + std::to_string(serial % 3);
  CompressionSpec& policy = p.policy;
  const int storage = Uniform(rng, -1, 7);
  if (storage >= 0) {
    policy.storage = kFormats[storage];
    policy.storage_set = true;
  }
  switch (Uniform(rng, 0, 3)) {
    case 1:
      policy.eviction = Eviction::kStreamingLlm;
      policy.sinks = Uniform(rng, 0, 4);
      policy.window = Uniform(rng, 8, 40);
      break;
    case 2:
      policy.eviction = Eviction::kH2o;
      policy.heavy = Uniform(rng, 1, 20);
      policy.recent = Uniform(rng, 8, 30);
      break;
    default:
      break;
  }
  if (Uniform(rng, 0, 1)) {
    const int64_t cap = policy.eviction == Eviction::kNone ? 24 : ProtectedRecent(policy);
    policy.residual_tokens = Uniform(rng, 1, static_cast<int>(std::min<int64_t>(cap, 24)));
  }
  auto r = store_->CreateSequence(p);
  if (!r.ok()) {
    Fail("CreateSequence failed: " + r.status().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.id = r->id;
  s.policy = policy;
  s.tier0 = policy.storage_set ? policy.storage : kRaw;
  s.residual = policy.residual_tokens;
  s.has_scores = false;
  s.ever_lossy = Lossy(s.tier0);
  s.log = {std::string("create ") + EvictionName(policy.eviction) + " sinks/window " +
           std::to_string(policy.sinks) + "/" + std::to_string(policy.window) + " heavy/recent " +
           std::to_string(policy.heavy) + "/" + std::to_string(policy.recent) + " storage " +
           kernels::StorageFormatName(s.tier0) + " residual " + std::to_string(s.residual)};
  s.now = Version();
  s.history.assign(1, std::make_shared<const Version>(s.now));
  s.first = 0;
}

bool World::Append(ModelSequence& s, std::mt19937& rng, int layer, int n) {
  const int64_t start = s.now.layer_tokens[static_cast<size_t>(layer)];
  const std::string k =
      MakeKv(kSeed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/false);
  const std::string v =
      MakeKv(kSeed, layer, start, n, kHeads, kDim, DType::kF16, /*is_value=*/true);
  AppendParams a;
  a.sequence_id = s.id;
  a.layer = layer;
  a.start_position = start;
  a.num_tokens = n;
  a.keys = k;
  a.values = v;
  auto r = store_->Append(a);
  if (!r.ok()) {
    Fail("Append: " + r.status().ToString());
    return false;
  }
  stats.appends.fetch_add(1);
  s.log.push_back("append L" + std::to_string(layer) + " " + std::to_string(start) + "+" +
                  std::to_string(n));
  Version next = s.now;
  next.layer_tokens[static_cast<size_t>(layer)] += n;
  const Chain fresh{s.residual > 0 ? kRaw : s.tier0};
  for (int h = 0; h < kHeads; ++h) {
    for (int t = 0; t < n; ++t)
      next.lanes[static_cast<size_t>(layer * kHeads + h)][static_cast<int32_t>(start + t)] = fresh;
  }
  // The automatic policy, when due: a lane a whole block over what the rule keeps.
  const EvictionRule rule = ResolveEviction(s.policy);
  const size_t before = s.now.lanes[static_cast<size_t>(layer * kHeads)].size();
  const bool due = rule.evicts() && (!rule.scored || s.has_scores) &&
                   static_cast<int64_t>(before) + n > rule.keeps() + kBlock;
  if (due && rule.scored) return Adopt(s, next, rule, {layer});  // restructures what survived
  if (due) {  // StreamingLLM: sinks + window, by position
    for (int h = 0; h < kHeads; ++h) {
      auto& lane = next.lanes[static_cast<size_t>(layer * kHeads + h)];
      std::map<int32_t, Chain> kept;
      int i = 0;
      for (auto it = lane.begin(); it != lane.end() && i < rule.sinks; ++it, ++i) kept.insert(*it);
      i = 0;
      for (auto it = lane.rbegin(); it != lane.rend() && i < rule.recent; ++it, ++i)
        kept.insert(*it);
      lane = kept;
    }
  }
  Restructure(s, next);
  s.now = next;
  s.Publish(next);
  (void)rng;
  return true;
}

bool World::Adopt(ModelSequence& s, const Version& candidates, const EvictionRule& rule,
                  const std::vector<int>& layers) {
  FetchParams f;
  f.sequence_id = s.id;
  f.include_unfinished = true;
  f.dtype = DType::kF32;
  std::vector<std::set<int32_t>> got(kLayers * kHeads);
  const absl::Status st = store_->Fetch(f, [&](FetchChunk& c) {
    for (int32_t p : c.positions) got[static_cast<size_t>(c.layer * kHeads + c.kv_head)].insert(p);
    return true;
  });
  if (!st.ok()) {
    Fail("adopting fetch: " + st.ToString());
    return false;
  }
  Version next = candidates;
  for (int layer : layers) {
    for (int h = 0; h < kHeads; ++h) {
      const size_t lane = static_cast<size_t>(layer * kHeads + h);
      const auto& cand = candidates.lanes[lane];
      const std::set<int32_t>& kept = got[lane];
      const size_t want = std::min<size_t>(cand.size(), static_cast<size_t>(rule.keeps()));
      if (kept.size() != want) {
        Fail("lane keeps " + std::to_string(kept.size()) + " tokens, rule says " +
             std::to_string(want));
        return false;
      }
      int i = 0;
      for (auto it = cand.rbegin(); it != cand.rend() && i < rule.recent; ++it, ++i) {
        if (!kept.count(it->first)) {
          Fail("a recent token was evicted: position " + std::to_string(it->first));
          return false;
        }
      }
      std::map<int32_t, Chain> lanemap;
      for (int32_t p : kept) {
        auto it = cand.find(p);
        if (it == cand.end()) {
          Fail("kept position " + std::to_string(p) + " was never stored");
          return false;
        }
        lanemap.insert(*it);
      }
      next.lanes[lane] = lanemap;
    }
  }
  stats.adopted.fetch_add(1);
  Restructure(s, next);
  s.now = next;
  s.Publish(next);
  return true;
}

std::vector<float> RandomQueries(std::mt19937& rng, int n) {
  std::vector<float> q(static_cast<size_t>(n) * kQHeads * kDim);
  for (float& x : q) x = static_cast<float>(Uniform(rng, -16, 16)) / 16.0f;
  return q;
}

bool World::Compress(ModelSequence& s, std::mt19937& rng) {
  CompressParams p;
  p.sequence_id = s.id;
  CompressionSpec& spec = p.spec;
  const int kind = Uniform(rng, 0, 4);
  const int64_t visible = s.now.visible();
  std::vector<std::vector<float>> held;
  auto add_queries = [&](int n) {
    for (int l = 0; l < kLayers; ++l) {
      held.push_back(RandomQueries(rng, n));
      LayerQueries q;
      q.layer = l;
      q.dtype = DType::kF32;
      q.queries = absl::string_view(reinterpret_cast<const char*>(held.back().data()),
                                    held.back().size() * sizeof(float));
      for (int i = 0; i < n; ++i)
        q.positions.push_back(static_cast<int32_t>(std::max<int64_t>(0, visible - n + i)));
      p.queries.push_back(std::move(q));
    }
  };
  const int64_t min_recent = s.residual;
  if (kind == 0) {
    spec.eviction = Eviction::kStreamingLlm;
    spec.sinks = Uniform(rng, 0, 3);
    spec.window = Uniform(rng, std::max<int>(1, static_cast<int>(min_recent)), 40);
  } else if (kind == 1) {
    spec.eviction = Eviction::kSnapKv;
    spec.window = Uniform(rng, std::max<int>(1, static_cast<int>(min_recent)), 12);
    spec.budget = spec.window + Uniform(rng, 1, 30);
    spec.pooling_kernel = 2 * Uniform(rng, 0, 3) + 1;
    spec.pooling_avg = Uniform(rng, 0, 1);
    add_queries(spec.window);
  } else if (kind == 2) {
    spec.eviction = Eviction::kH2o;
    spec.heavy = Uniform(rng, 0, 20);
    spec.recent = Uniform(rng, std::max<int>(1, static_cast<int>(min_recent)), 30);
    if (Uniform(rng, 0, 1) || !s.has_scores) add_queries(Uniform(rng, 1, 8));
  }
  if (kind >= 3 || Uniform(rng, 0, 2) == 0) {
    spec.storage = kFormats[Uniform(rng, 0, 7)];
    spec.storage_set = true;
  }
  // Setting a residual is allowed while the tokens are still raw and none is kept yet.
  if (s.residual == 0 && s.tier0 == kRaw && !s.ever_lossy && Uniform(rng, 0, 2) == 0) {
    int64_t cap = 24;
    for (const CompressionSpec* rule : {&spec, &s.policy}) {
      if (ProtectedRecent(*rule) >= 0) cap = std::min(cap, ProtectedRecent(*rule));
    }
    if (cap >= 1) spec.residual_tokens = Uniform(rng, 1, static_cast<int>(cap));
  }
  auto r = store_->Compress(p);
  if (!r.ok()) {
    Fail("Compress: " + r.status().ToString());
    return false;
  }
  stats.compresses.fetch_add(1);
  s.log.push_back(std::string("compress ") + EvictionName(spec.eviction) + " sinks/window " +
                  std::to_string(spec.sinks) + "/" + std::to_string(spec.window) + " budget " +
                  std::to_string(spec.budget) + " heavy/recent " + std::to_string(spec.heavy) +
                  "/" + std::to_string(spec.recent) + " storage " +
                  (spec.storage_set ? kernels::StorageFormatName(spec.storage) : "-") +
                  " residual " + std::to_string(spec.residual_tokens) + " queries " +
                  std::to_string(p.queries.size()));
  const bool scoring =
      spec.eviction == Eviction::kSnapKv || (spec.eviction == Eviction::kH2o && !p.queries.empty());
  if (scoring) s.has_scores = true;
  // Format changes apply to tier 0's tokens (the residual's stay raw).
  Version next = s.now;
  const StorageFormat to = spec.storage_set ? spec.storage : s.tier0;
  const int64_t residual_after = spec.residual_tokens > 0 ? spec.residual_tokens : s.residual;
  const EvictionRule rule = ResolveEviction(spec);
  if (rule.evicts() && !rule.scored) {
    for (auto& lane : next.lanes) {
      std::map<int32_t, Chain> kept;
      int i = 0;
      for (auto it = lane.begin(); it != lane.end() && i < rule.sinks; ++it, ++i) kept.insert(*it);
      i = 0;
      for (auto it = lane.rbegin(); it != lane.rend() && i < rule.recent; ++it, ++i)
        kept.insert(*it);
      lane = kept;
    }
  }
  auto convert = [&](Version& v) {
    for (auto& lane : v.lanes) {
      int64_t rank = static_cast<int64_t>(lane.size());
      for (auto& [pos, chain] : lane) {
        --rank;
        if (rank < residual_after) continue;  // in the raw residual
        if (chain.back() != to) chain.push_back(to);
      }
    }
  };
  s.tier0 = to;
  s.residual = residual_after;
  s.ever_lossy |= Lossy(to);
  if (rule.evicts() && rule.scored) {
    // Which tokens survive is the scores' choice: read it, then apply the conversion.
    std::vector<int> layers(kLayers);
    for (int l = 0; l < kLayers; ++l) layers[static_cast<size_t>(l)] = l;
    if (!Adopt(s, next, rule, layers)) return false;
    Version adopted = s.now;
    convert(adopted);
    s.now = adopted;
    std::lock_guard<std::mutex> lock(s.mu);
    s.history.back() =
        std::make_shared<const Version>(adopted);  // the adopted state was never seen unconverted
    return true;
  }
  convert(next);
  s.now = next;
  s.Publish(next);
  return true;
}

bool World::Attend(ModelSequence& s, std::mt19937& rng) {
  const int layer = Uniform(rng, 0, kLayers - 1);
  const std::vector<float> q = RandomQueries(rng, 1);
  AttendParams a;
  a.sequence_id = s.id;
  a.layer = layer;
  a.dtype = DType::kF32;
  a.queries = absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * sizeof(float));
  a.positions = {static_cast<int32_t>(s.now.layer_tokens[static_cast<size_t>(layer)])};
  a.want_weights = Uniform(rng, 0, 1);
  auto r = store_->Attend(a);
  if (!r.ok()) {
    Fail("Attend: " + r.status().ToString());
    return false;
  }
  stats.attends.fetch_add(1);
  s.has_scores = true;
  const float* out = reinterpret_cast<const float*>(r->output.data());
  for (int qh = 0; qh < kQHeads; ++qh) {
    const int h = qh / (kQHeads / kHeads);
    const auto& lane = s.now.lanes[static_cast<size_t>(layer * kHeads + h)];
    std::vector<double> logits, acc(kDim, 0.0);
    std::vector<std::vector<float>> vals;
    for (const auto& [pos, chain] : lane) {
      const std::vector<float> k = Expected(layer, h, pos, chain, /*value=*/false);
      double dot = 0;
      for (int e = 0; e < kDim; ++e)
        dot += double{q[static_cast<size_t>(qh * kDim + e)]} * k[static_cast<size_t>(e)];
      logits.push_back(dot / std::sqrt(double{kDim}));
      vals.push_back(Expected(layer, h, pos, chain, /*value=*/true));
    }
    if (!logits.empty()) {
      const double mx = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (double& x : logits) z += (x = std::exp(x - mx));
      for (size_t t = 0; t < logits.size(); ++t)
        for (int e = 0; e < kDim; ++e)
          acc[static_cast<size_t>(e)] += logits[t] / z * vals[t][static_cast<size_t>(e)];
    }
    for (int e = 0; e < kDim; ++e) {
      const double got = out[qh * kDim + e];
      if (std::fabs(got - acc[static_cast<size_t>(e)]) >
          2e-3 * (1 + std::fabs(acc[static_cast<size_t>(e)]))) {
        Fail("Attend output differs from dense attention over the model's tokens (layer " +
             std::to_string(layer) + ", query head " + std::to_string(qh) + ")");
        return false;
      }
    }
  }
  return true;
}

void World::Writer(uint32_t seed, std::chrono::steady_clock::time_point end) {
  std::mt19937 rng(seed);
  while (std::chrono::steady_clock::now() < end && stats.mismatches.load() == 0) {
    const int slot = Uniform(rng, 0, kSlots - 1);
    ModelSequence& s = *slots_[static_cast<size_t>(slot)];
    std::lock_guard<std::mutex> w(s.writer);
    const int op = Uniform(rng, 0, 99);
    const int64_t most = *std::max_element(s.now.layer_tokens.begin(), s.now.layer_tokens.end());
    if (op < 35 || most == 0) {  // one layer, in order
      const int layer = Uniform(rng, 0, kLayers - 1);
      Append(s, rng, layer, Uniform(rng, 1, 12));
    } else if (op < 50) {  // AppendStream-style prefill: every layer the same range
      const int n = Uniform(rng, 1, 40);
      const int64_t visible = s.now.visible();
      for (int l = 0; l < kLayers; ++l) {
        const int64_t have = s.now.layer_tokens[static_cast<size_t>(l)];
        const int64_t want = visible + n - have;
        if (want > 0 && !Append(s, rng, l, static_cast<int>(want))) break;
      }
    } else if (op < 65) {
      Compress(s, rng);
    } else if (op < 90) {
      Attend(s, rng);
    } else if (op < 93 || most > 600) {
      auto r = store_->Release(s.id);
      if (!r.ok()) Fail("Release: " + r.status().ToString());
      stats.releases.fetch_add(1);
      Version gone;
      gone.released = true;
      s.Publish(gone);
      Recreate(s, rng);
    }
    if (self_check_) SelfCheck(s, op);
  }
}

void World::SelfCheck(ModelSequence& s, int op) {
  for (bool stored : {false, true}) {
    FetchParams f;
    f.sequence_id = s.id;
    f.dtype = DType::kF32;
    if (stored) f.format = FetchFormat::kStored;
    std::vector<FetchChunk> chunks;
    const absl::Status st = store_->Fetch(f, [&](FetchChunk& c) {
      chunks.push_back(std::move(c));
      return true;
    });
    if (!st.ok()) {
      Fail("self-check Fetch: " + st.ToString());
      return;
    }
    const std::string why = Mismatch(chunks, s.now, stored);
    if (!why.empty() && std::getenv("KVC_THREADED_MODEL_DUMP")) {
      for (const FetchChunk& c : chunks) {
        std::string line = "  service L" + std::to_string(c.layer) + "H" +
                           std::to_string(c.kv_head) + " " + kernels::StorageFormatName(c.storage) +
                           ":";
        for (int32_t p : c.positions) line += " " + std::to_string(p);
        std::printf("%s\n", line.c_str());
      }
      for (size_t lane = 0; lane < s.now.lanes.size(); ++lane) {
        std::string line = "  model lane " + std::to_string(lane) + ":";
        for (const auto& [p, chain] : s.now.lanes[lane])
          line += " " + std::to_string(p) + "/" + ChainName(chain);
        std::printf("%s\n", line.c_str());
      }
      for (const std::string& l : s.log) std::printf("  op: %s\n", l.c_str());
      std::printf("  layer tokens %lld %lld\n", static_cast<long long>(s.now.layer_tokens[0]),
                  static_cast<long long>(s.now.layer_tokens[1]));
    }
    if (!why.empty()) {
      Fail("after op " + std::to_string(op) + " (policy " + EvictionName(s.policy.eviction) +
           ", tier 0 " + kernels::StorageFormatName(s.tier0) + ", residual " +
           std::to_string(s.residual) + "): " + why);
      return;
    }
  }
}

std::string ChainName(const Chain& chain) {
  std::string out;
  for (StorageFormat f : chain) out += std::string(kernels::StorageFormatName(f)) + ">";
  return out;
}

// "" when `chunks` (one Fetch's, every layer) show exactly version `v`; else the first
// difference.
std::string Mismatch(const std::vector<FetchChunk>& chunks, const Version& v, bool stored) {
  std::vector<std::map<int32_t, int>> seen(kLayers * kHeads);
  for (const FetchChunk& c : chunks) {
    if (c.visible_tokens != v.visible()) return "visible_tokens";
    const auto& lane = v.lanes[static_cast<size_t>(c.layer * kHeads + c.kv_head)];
    for (int i = 0; i < c.num_tokens; ++i) {
      const int32_t pos = c.positions[static_cast<size_t>(i)];
      auto it = lane.find(pos);
      if (it == lane.end() || pos >= v.visible()) return "position " + std::to_string(pos);
      ++seen[static_cast<size_t>(c.layer * kHeads + c.kv_head)][pos];
      const std::string where = " of position " + std::to_string(pos) + " layer " +
                                std::to_string(c.layer) + " head " + std::to_string(c.kv_head) +
                                " (chunk " + kernels::StorageFormatName(c.storage) + ", model " +
                                ChainName(it->second) + ")";
      if (stored) {
        const size_t rb = static_cast<size_t>(c.record_bytes);
        if (c.storage != it->second.back()) return "stored format" + where;
        if (c.keys.compare(i * rb, rb,
                           ExpectedRecord(c.layer, c.kv_head, pos, it->second, /*value=*/false)) !=
            0)
          return "stored key record" + where;
        if (c.values.compare(i * rb, rb,
                             ExpectedRecord(c.layer, c.kv_head, pos, it->second, /*value=*/true)) !=
            0)
          return "stored value record" + where;
        continue;
      }
      for (bool value : {false, true}) {
        std::vector<float> want = Expected(c.layer, c.kv_head, pos, it->second, value);
        std::vector<float> got(kDim);
        const std::string& bytes = value ? c.values : c.keys;
        const size_t row = kDim * kernels::DTypeSize(c.dtype);
        kernels::ConvertElements(bytes.data() + i * row, c.dtype, got.data(), DType::kF32, kDim);
        if (c.dtype == DType::kF16) {
          std::vector<uint16_t> h(kDim);
          kernels::ConvertElements(want.data(), DType::kF32, h.data(), DType::kF16, kDim);
          kernels::ConvertElements(h.data(), DType::kF16, want.data(), DType::kF32, kDim);
        }
        if (std::memcmp(got.data(), want.data(), kDim * sizeof(float)) != 0) {
          return std::string(value ? "value" : "key") + where;
        }
      }
    }
  }
  for (size_t lane = 0; lane < v.lanes.size(); ++lane) {
    for (const auto& [pos, chain] : v.lanes[lane]) {
      if (pos < v.visible() && seen[lane][pos] != 1) {
        return "position " + std::to_string(pos) + " of lane " + std::to_string(lane) + " served " +
               std::to_string(seen[lane][pos]) + " times";
      }
    }
  }
  return "";
}

void World::Reader(uint32_t seed, std::chrono::steady_clock::time_point end) {
  std::mt19937 rng(seed);
  while (std::chrono::steady_clock::now() < end && stats.mismatches.load() == 0) {
    ModelSequence& s = *slots_[static_cast<size_t>(Uniform(rng, 0, kSlots - 1))];
    std::string id;
    int64_t v0;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      id = s.id;
      v0 = s.first + static_cast<int64_t>(s.history.size()) - 1;
    }
    FetchParams f;
    f.sequence_id = id;
    const int mode = Uniform(rng, 0, 2);  // f32, f16, stored
    if (mode == 1) f.dtype = DType::kF16;
    if (mode == 0) f.dtype = DType::kF32;
    if (mode == 2) f.format = FetchFormat::kStored;
    f.max_chunk_bytes = Uniform(rng, 0, 1) ? 4096 : 0;
    std::vector<FetchChunk> chunks;
    const absl::Status st = store_->Fetch(f, [&](FetchChunk& c) {
      chunks.push_back(std::move(c));
      return true;
    });
    std::vector<std::shared_ptr<const Version>> candidates;
    {
      // A writer publishes after its op returns: wait for any in flight, then look.
      std::lock_guard<std::mutex> w(s.writer);
      std::lock_guard<std::mutex> lock(s.mu);
      // Released and recreated meanwhile: its history is gone; nothing to compare with.
      if (s.id != id) continue;
      for (int64_t v = std::max(v0, s.first); v < s.first + static_cast<int64_t>(s.history.size());
           ++v) {
        candidates.push_back(s.history[static_cast<size_t>(v - s.first)]);
      }
    }
    stats.fetches.fetch_add(1);
    if (st.code() == Code::kAborted) {
      stats.aborted.fetch_add(1);
      continue;
    }
    if (st.code() == Code::kNotFound) continue;  // released while we looked
    if (!st.ok()) {
      Fail("Fetch: " + st.ToString());
      continue;
    }
    bool matched = false;
    std::string why;
    for (const auto& v : candidates) {
      if (v->released) continue;
      why = Mismatch(chunks, *v, mode == 2);
      if (why.empty()) {
        matched = true;
        break;
      }
    }
    if (!matched) Fail("a Fetch returned a state that never existed (" + why + ")");
  }
}

void World::CheckAccounting() {
  // Blocks in use must be what the model's token counts need: per lane, ceil of each tier.
  int64_t want = 0;
  for (const auto& s : slots_) {
    for (const auto& lane : s->now.lanes) {
      const int64_t n = static_cast<int64_t>(lane.size());
      const int64_t res = std::min(n, s->residual);
      want += CeilDiv(n - res, kBlock) + CeilDiv(res, kBlock);
    }
  }
  auto stats = store_->stats().GetPoolStats("t");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->used_blocks, want) << "blocks in use differ from the model's count";
  EXPECT_EQ(stats->sequences, kSlots);
  // Tenant accounts (quotas) are charged exactly what the sequences hold.
  int64_t tenant_bytes = 0;
  int64_t tenant_sequences = 0;
  for (const TenantUsageSnapshot& t : store_->stats().TenantUsage()) {
    tenant_bytes += t.pool_bytes.at(0);
    tenant_sequences += t.sequences;
  }
  EXPECT_EQ(tenant_bytes, stats->used_bytes) << "tenant accounts differ from the pool";
  EXPECT_EQ(tenant_sequences, kSlots);
  for (const auto& s : slots_) KVC_EXPECT_OK(store_->Release(s->id).status());
  stats = store_->stats().GetPoolStats("t");
  EXPECT_EQ(stats->used_blocks, 0) << "blocks leaked";
  for (const TenantUsageSnapshot& t : store_->stats().TenantUsage()) {
    EXPECT_EQ(t.pool_bytes.at(0), 0) << t.tenant << " is still charged";
    EXPECT_EQ(t.sequences, 0) << t.tenant;
  }
}

TEST(ThreadedModelTest, EveryFetchSeesAStateThatExisted) {
  int seconds = 20;
  if (const char* env = std::getenv("KVC_THREADED_MODEL_SECONDS")) seconds = std::atoi(env);
  const uint32_t seed = 20261201;
  World world(seed);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < 2; ++i)
    threads.emplace_back([&, i] { world.Writer(seed + 10 + i, end); });
  for (uint32_t i = 0; i < 2; ++i)
    threads.emplace_back([&, i] { world.Reader(seed + 20 + i, end); });
  for (auto& t : threads) t.join();
  const Stats& st = world.stats;
  std::printf(
      "threaded model: %lld fetches (%lld aborted), %lld appends, %lld compresses, "
      "%lld attends, %lld releases, %lld adopted outcomes, %lld mismatches\n",
      static_cast<long long>(st.fetches.load()), static_cast<long long>(st.aborted.load()),
      static_cast<long long>(st.appends.load()), static_cast<long long>(st.compresses.load()),
      static_cast<long long>(st.attends.load()), static_cast<long long>(st.releases.load()),
      static_cast<long long>(st.adopted.load()), static_cast<long long>(st.mismatches.load()));
  for (const std::string& f : world.failures()) ADD_FAILURE() << f;
  EXPECT_EQ(st.mismatches.load(), 0);
  EXPECT_GT(st.fetches.load() - st.aborted.load(), 0);
  EXPECT_GT(st.compresses.load(), 0);
  world.CheckAccounting();
}

}  // namespace
}  // namespace kvc::cachesvc
