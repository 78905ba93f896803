// concurrency_benchmark: does one sequence's heavy work hold up another's? Measures, in one
// run and on the same store:
//   1. Attend latency of a short sequence (one decode step of one layer) when idle, and while
//      another sequence of --tokens tokens is compressed (SnapKV + INT4) on another thread:
//      the ratio is what a decode loop pays for sharing the service with a prefill;
//   2. GetPoolStats cost with 100 and with 10,000 live sequences (the ratio is ~1 when
//      statistics read running totals instead of visiting sequences);
//   3. Append throughput of 1 MiB messages (256 tokens of keys and values), round-robin over
//      the layers as a prefill sends them, by 1 and by 2 writers (each on its own sequence),
//      against a memcpy of the same bytes: the store's write path without any transport.
//
//   concurrency_benchmark [--tokens=32768] [--layers=4] [--quick]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "cachesvc/core/store/kv_store.h"

ABSL_FLAG(int32_t, tokens, 32768, "tokens of the sequence being compressed");
ABSL_FLAG(int32_t, layers, 4, "layers of the Llama-3-8B-shaped pool (8 kv heads, d 128)");
ABSL_FLAG(int32_t, short_tokens, 4096, "tokens of the sequence Attend runs on");
ABSL_FLAG(bool, quick, false, "tiny shapes (smoke test)");

namespace {

using namespace kvc::cachesvc;  // NOLINT: a benchmark binary
using Clock = std::chrono::steady_clock;

constexpr int kHeads = 8, kQHeads = 32, kDim = 128;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<uint16_t> RandomHalf(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = d(rng);
  std::vector<uint16_t> h(n);
  kvc::kernels::ConvertElements(f.data(), DType::kF32, h.data(), DType::kF16, n);
  return h;
}

std::string Fill(KvStore& store, int layers, int tokens) {
  auto seq = store.CreateSequence({});
  if (!seq.ok()) std::abort();
  constexpr int kChunk = 2048;
  const std::vector<uint16_t> kv = RandomHalf(static_cast<size_t>(kChunk) * kHeads * kDim, 1);
  for (int l = 0; l < layers; ++l) {
    for (int start = 0; start < tokens; start += kChunk) {
      const int n = std::min(kChunk, tokens - start);
      AppendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.start_position = start;
      a.num_tokens = n;
      a.keys = a.values = absl::string_view(reinterpret_cast<const char*>(kv.data()),
                                            static_cast<size_t>(n) * kHeads * kDim * 2);
      if (!store.Append(a).ok()) std::abort();
    }
  }
  return seq->id;
}

// The q-quantile (0.5 = median) of v.
double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

// GB/s of `writers` threads each appending `messages` messages of kChunk tokens (layers
// round-robin) to its own sequence; the median of `rounds` rounds after one warm-up round (the
// first touch of the pool's pages is a one-time cost of a fresh server, not of the write path).
double AppendGbps(KvStore& store, int layers, int writers, int messages, int rounds) {
  constexpr int kChunk = 256;
  const std::vector<uint16_t> kv = RandomHalf(static_cast<size_t>(kChunk) * kHeads * kDim, 9);
  const size_t half = kv.size() * 2;
  std::vector<double> gbps;
  for (int round = 0; round <= rounds; ++round) {
    std::vector<std::string> ids;
    for (int w = 0; w < writers; ++w) {
      auto seq = store.CreateSequence({});
      if (!seq.ok()) std::abort();
      ids.push_back(seq->id);
    }
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(writers));
    for (int w = 0; w < writers; ++w) {
      threads.emplace_back([&, w] {
        for (int m = 0; m < messages; ++m) {
          AppendParams a;
          a.sequence_id = ids[static_cast<size_t>(w)];
          a.layer = m % layers;
          a.start_position = int64_t{m / layers} * kChunk;
          a.num_tokens = kChunk;
          a.keys = a.values = absl::string_view(reinterpret_cast<const char*>(kv.data()), half);
          if (!store.Append(a).ok()) std::abort();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const double seconds = Since(t0);
    if (round > 0) gbps.push_back(2.0 * half * messages * writers / seconds / 1e9);
    for (const std::string& id : ids) {
      if (!store.Release(id).ok()) std::abort();
    }
  }
  return Quantile(gbps, 0.5);
}

// Single-thread memcpy GB/s over `bytes` (destination touched first), median of 5.
double MemcpyGbps(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  std::vector<double> gbps;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    gbps.push_back(static_cast<double>(bytes) / Since(t0) / 1e9);
  }
  if (dst[bytes / 2] != 1) std::abort();
  return Quantile(gbps, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int tokens = quick ? 2048 : absl::GetFlag(FLAGS_tokens);
  const int layers = quick ? 2 : absl::GetFlag(FLAGS_layers);
  const int short_tokens = quick ? 512 : absl::GetFlag(FLAGS_short_tokens);
  PoolOptions pool;
  pool.geometry = {layers, kHeads, kQHeads, kDim, 16, DType::kF16, {}};
  pool.capacity_bytes = int64_t{3} << 30;
  // Rounds reuse warm pages, as a server whose churn stays under keep_free_bytes does: what is
  // measured is the data path, not the OS handing out pages (~1 ms per MiB here).
  pool.keep_free_bytes = pool.capacity_bytes;
  KvStoreOptions o;
  o.pools.push_back(pool);
  auto store = std::move(*KvStore::Create(o));
  const std::string big = Fill(*store, layers, tokens);
  const std::string small = Fill(*store, layers, short_tokens);

  const std::vector<uint16_t> q = RandomHalf(kQHeads * kDim, 2);
  auto attend = [&]() {
    AttendParams a;
    a.sequence_id = small;
    a.layer = 0;
    a.queries = absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * 2);
    a.positions = {short_tokens};
    const auto t0 = Clock::now();
    if (!store->Attend(a).ok()) std::abort();
    return Since(t0);
  };
  std::vector<double> idle;
  idle.reserve(200);
  for (int i = 0; i < (quick ? 20 : 200); ++i) idle.push_back(attend());

  std::vector<std::vector<uint16_t>> window;
  CompressParams cp;
  cp.sequence_id = big;
  cp.spec.eviction = CompressionSpec::Eviction::kSnapKv;
  cp.spec.window = 32;
  cp.spec.budget = quick ? 256 : 2048;
  cp.spec.storage = StorageFormat::kInt4G32;
  cp.spec.storage_set = true;
  for (int l = 0; l < layers; ++l) {
    window.push_back(
        RandomHalf(static_cast<size_t>(32) * kQHeads * kDim, 3 + static_cast<uint32_t>(l)));
    LayerQueries lq;
    lq.layer = l;
    lq.queries = absl::string_view(reinterpret_cast<const char*>(window.back().data()),
                                   window.back().size() * 2);
    for (int i = 0; i < 32; ++i) lq.positions.push_back(tokens - 32 + i);
    cp.queries.push_back(std::move(lq));
  }
  std::atomic<bool> done{false};
  double compress_seconds = 0;
  std::thread compressor([&] {
    const auto t0 = Clock::now();
    if (!store->Compress(cp).ok()) std::abort();
    compress_seconds = Since(t0);
    done = true;
  });
  std::vector<double> busy;
  while (!done) busy.push_back(attend());
  compressor.join();

  // Statistics cost at 100 and 10,000 sequences (empty ones: what they hold is irrelevant).
  auto stats_cost = [&]() {
    double best = 1e9;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 100; ++i) (void)store->stats().GetPoolStats("");
      best = std::min(best, Since(t0) / 100);
    }
    return best;
  };
  for (int i = 0; i < 98; ++i) (void)store->CreateSequence({});
  const double stats_100 = stats_cost();
  for (int i = 0; i < 9900; ++i) (void)store->CreateSequence({});
  const double stats_10k = stats_cost();

  // 256 MiB per writer (64 MiB quick): large enough to leave the caches.
  const int messages = quick ? 64 : 256;
  const double memcpy_gbps = MemcpyGbps(static_cast<size_t>(messages) << 20);
  const double append_1 = AppendGbps(*store, layers, 1, messages, quick ? 1 : 5);
  const double append_2 = AppendGbps(*store, layers, 2, messages, quick ? 1 : 5);

  std::printf("concurrency_benchmark: %d layers x %d kv heads x d %d, f16, %u hardware threads\n",
              layers, kHeads, kDim, std::thread::hardware_concurrency());
  std::printf("  Attend (1 query, %d stored tokens), idle: median %.3f ms, p99 %.3f ms\n",
              short_tokens, Quantile(idle, 0.5) * 1e3, Quantile(idle, 0.99) * 1e3);
  std::printf(
      "  during a %d-token SnapKV+INT4 Compress (%.2f s), %zu steps: median %.3f ms "
      "(%.2fx idle), p99 %.3f ms (%.2fx), max %.3f ms\n",
      tokens, compress_seconds, busy.size(), Quantile(busy, 0.5) * 1e3,
      Quantile(busy, 0.5) / Quantile(idle, 0.5), Quantile(busy, 0.99) * 1e3,
      Quantile(busy, 0.99) / Quantile(idle, 0.5), Quantile(busy, 1.0) * 1e3);
  std::printf("  GetPoolStats: %.2f us at 100 sequences, %.2f us at 10,000 = %.2fx\n",
              stats_100 * 1e6, stats_10k * 1e6, stats_10k / stats_100);
  std::printf(
      "  Append, 1 MiB messages over %d layers: 1 writer %.2f GB/s (%.3fx memcpy), 2 writers "
      "%.2f GB/s (%.3fx); memcpy %.2f GB/s\n",
      layers, append_1, append_1 / memcpy_gbps, append_2, append_2 / memcpy_gbps, memcpy_gbps);
  return 0;
}
