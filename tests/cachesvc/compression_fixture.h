// Shared fixture of the compression tests: a small f32 pool, one sequence, seeded Gaussian KV
// appended to every layer, and readers for what is stored (positions, dense K/V per head),
// plus a double-precision reference attention.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {

using Eviction = CompressionSpec::Eviction;

struct Geometry {
  int layers = 2, heads = 2, qheads = 4, dim = 64, block = 16;
  double rope_theta = 0;  // > 0: the pool has RoPE settings (NeoX, every dim rotated)
};

inline KvStoreOptions Options(const Geometry& g, int64_t capacity = int64_t{64} << 20) {
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.name = "c";
  pool.geometry.num_layers = g.layers;
  pool.geometry.num_kv_heads = g.heads;
  pool.geometry.num_query_heads = g.qheads;
  pool.geometry.head_dim = g.dim;
  pool.geometry.block_tokens = g.block;
  pool.geometry.dtype = DType::kF32;
  if (g.rope_theta > 0) {
    pool.geometry.rope.enabled = true;
    pool.geometry.rope.theta = g.rope_theta;
  }
  pool.capacity_bytes = capacity;
  KvStoreOptions o;
  o.pools.push_back(pool);
  return o;
}

// Dense f32 KV for a whole layer, [n, heads, dim], Gaussian, seeded.
inline std::vector<float> Gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

class Fixture {
 public:
  explicit Fixture(Geometry g = {}, CompressionSpec policy = {},
                   int64_t capacity = int64_t{64} << 20)
      : geom(g) {
    auto created = KvStore::Create(Options(g, capacity));
    EXPECT_TRUE(created.ok()) << created.status();
    store = std::move(*created);
    CreateSequenceParams p;
    p.policy = policy;
    auto seq = store->CreateSequence(p);
    EXPECT_TRUE(seq.ok()) << seq.status();
    if (seq.ok()) id = seq->id;
  }

  // Appends n tokens to every layer; keys/values per layer remembered for references.
  absl::Status AppendAll(int64_t start, int64_t n,
                         const std::vector<float>* keys_override = nullptr) {
    for (int l = 0; l < geom.layers; ++l) {
      std::vector<float> k = keys_override
                                 ? *keys_override
                                 : Gaussian(static_cast<size_t>(n * geom.heads * geom.dim),
                                            1000 * l + static_cast<uint32_t>(start));
      std::vector<float> v = Gaussian(k.size(), 7777 + 1000 * l + static_cast<uint32_t>(start));
      AppendParams a;
      a.sequence_id = id;
      a.layer = l;
      a.start_position = start;
      a.num_tokens = n;
      a.dtype = DType::kF32;
      a.keys = Bytes(k);
      a.values = Bytes(v);
      auto r = store->Append(a);
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  // `steps` decode steps of Attend with f32 queries at `position` (H2O accumulates scores).
  absl::Status AttendSteps(const std::vector<float>& queries, int32_t position, int steps) {
    for (int step = 0; step < steps; ++step) {
      AttendParams a;
      a.sequence_id = id;
      a.dtype = DType::kF32;
      a.queries = Bytes(queries);
      a.positions = {position};
      auto r = store->Attend(a);
      if (!r.ok()) return r.status();
    }
    return absl::OkStatus();
  }

  // Stored positions per (layer, head), via Fetch.
  std::map<std::pair<int, int>, std::set<int32_t>> Positions() {
    std::map<std::pair<int, int>, std::set<int32_t>> out;
    FetchParams f;
    f.sequence_id = id;
    EXPECT_THAT(
        store->Fetch(f,
                     [&](FetchChunk& c) {
                       out[{c.layer, c.kv_head}].insert(c.positions.begin(), c.positions.end());
                       return true;
                     }),
        ::kvc::testing::IsOk());
    return out;
  }

  // Dense f32 K/V and positions of one (layer, head) as stored.
  struct Head {
    std::vector<float> k, v;
    std::vector<int32_t> pos;
  };
  Head Fetched(int layer, int head) {
    Head out;
    FetchParams f;
    f.sequence_id = id;
    f.layers = {layer};
    f.dtype = DType::kF32;
    EXPECT_THAT(store->Fetch(f,
                             [&](FetchChunk& c) {
                               if (c.kv_head != head) return true;
                               const float* k = reinterpret_cast<const float*>(c.keys.data());
                               const float* v = reinterpret_cast<const float*>(c.values.data());
                               out.k.insert(out.k.end(), k, k + c.keys.size() / 4);
                               out.v.insert(out.v.end(), v, v + c.values.size() / 4);
                               out.pos.insert(out.pos.end(), c.positions.begin(),
                                              c.positions.end());
                               return true;
                             }),
                ::kvc::testing::IsOk());
    return out;
  }

  Geometry geom;
  std::unique_ptr<KvStore> store;
  std::string id;
};

// Compress(spec) on sequence `id`: its status only.
inline absl::Status Mutate(KvStore& s, const std::string& id, const CompressionSpec& spec) {
  CompressParams p;
  p.sequence_id = id;
  p.spec = spec;
  return s.Compress(p).status();
}

// Conversion to INT4 (groups of 32), no eviction.
inline CompressionSpec Int4() {
  CompressionSpec s;
  s.storage = StorageFormat::kInt4G32;
  s.storage_set = true;
  return s;
}

inline CompressionSpec Streaming(int sinks, int window) {
  CompressionSpec s;
  s.eviction = Eviction::kStreamingLlm;
  s.sinks = sinks;
  s.window = window;
  return s;
}

// Observation queries of one layer, all pointing along `direction` (scaled), [w, qheads, dim].
inline std::vector<float> QueriesAlong(const std::vector<float>& direction, int window, int qheads,
                                       float scale) {
  std::vector<float> q;
  for (int t = 0; t < window; ++t)
    for (int h = 0; h < qheads; ++h)
      for (float x : direction) q.push_back(scale * x);
  return q;
}

// Reference decode attention in double over dense K/V [n, dim] for one query head.
inline std::vector<double> Attention(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, int dim) {
  const size_t n = k.size() / static_cast<size_t>(dim);
  std::vector<double> logits(n);
  double mx = -1e300;
  for (size_t t = 0; t < n; ++t) {
    double s = 0;
    for (int e = 0; e < dim; ++e) s += double{q[e]} * k[t * dim + e];
    logits[t] = s / std::sqrt(double(dim));
    mx = std::max(mx, logits[t]);
  }
  double z = 0;
  for (double& x : logits) z += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(dim), 0.0);
  for (size_t t = 0; t < n; ++t)
    for (int e = 0; e < dim; ++e) out[e] += logits[t] / z * v[t * dim + e];
  return out;
}

}  // namespace kvc::cachesvc
