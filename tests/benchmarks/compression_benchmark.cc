// compression_benchmark: what compression buys and costs inside the service (KvStore, no
// RPC), each figure beside a baseline measured in the same run.
//   1. bytes per token and tokens per GiB of pool for every storage format;
//   2. SnapKV + INT4 on a long prompt at a fixed budget: bytes against f16;
//   3. Compress(SnapKV) time against reading the sequence's KV once at memcpy speed;
//   4. Attend latency per decode step at two context lengths against memcpy of the bytes
//      that step reads.
//
//   compression_benchmark [--tokens=32768] [--budget=2048] [--residual=0] [--layers=32]
//                         [--json=FILE]
//   (--quick: small shapes, for the ctest smoke run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "cachesvc/core/store/kv_store.h"

ABSL_FLAG(int32_t, tokens, 32768, "prompt tokens for the SnapKV and Attend measurements");
ABSL_FLAG(int32_t, budget, 2048, "SnapKV budget (tokens kept per kv head)");
ABSL_FLAG(int32_t, residual, 0,
          "newest tokens per kv head kept raw (f16) beside INT4 in the SnapKV step (<= 32)");
ABSL_FLAG(int32_t, layers, 32,
          "layers of the Llama-3-8B-shaped pool (8 kv heads, 32 q heads, d 128)");
ABSL_FLAG(int32_t, attend_short, 4096, "stored tokens for the short Attend measurement");
ABSL_FLAG(bool, quick, false, "tiny shapes (smoke test)");
ABSL_FLAG(std::string, json, "", "also write the results as JSON");

namespace {

using namespace kvc::cachesvc;  // NOLINT: a benchmark binary
using kvc::kernels::StorageFormat;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr int kHeads = 8, kQHeads = 32, kDim = 128;

std::unique_ptr<KvStore> MakeStore(int layers, int64_t capacity) {
  PoolOptions pool;
  pool.name = "llama8b";
  pool.geometry.num_layers = layers;
  pool.geometry.num_kv_heads = kHeads;
  pool.geometry.num_query_heads = kQHeads;
  pool.geometry.head_dim = kDim;
  pool.geometry.dtype = DType::kF16;
  pool.capacity_bytes = capacity;
  // Rounds reuse warm pages, as a server whose churn stays under keep_free_bytes does: what is
  // measured is the data path, not the OS handing out pages (~1 ms per MiB here).
  pool.keep_free_bytes = pool.capacity_bytes;
  KvStoreOptions o;
  o.pools.push_back(pool);
  auto store = KvStore::Create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::_Exit(1);  // not std::exit (MT-unsafe): the CPU backend's threads are running
  }
  return std::move(*store);
}

std::string RandomF16(size_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> f(elements);
  for (float& x : f) x = d(rng);
  std::string out(elements * 2, '\0');
  kvc::kernels::ConvertElements(f.data(), DType::kF32, out.data(), DType::kF16, elements);
  return out;
}

// Appends `tokens` tokens to every layer in chunks of 1024 (the same payload each chunk).
void Fill(KvStore& store, const std::string& id, int layers, int64_t tokens) {
  const int64_t chunk = std::min<int64_t>(1024, tokens);
  const std::string kv = RandomF16(static_cast<size_t>(chunk) * kHeads * kDim, 1);
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t n = std::min(chunk, tokens - start);
    for (int l = 0; l < layers; ++l) {
      AppendParams a;
      a.sequence_id = id;
      a.layer = l;
      a.start_position = start;
      a.num_tokens = n;
      a.keys = absl::string_view(kv.data(), static_cast<size_t>(n) * kHeads * kDim * 2);
      a.values = a.keys;
      auto r = store.Append(a);
      if (!r.ok()) {
        std::fprintf(stderr, "append: %s\n", r.status().ToString().c_str());
        std::_Exit(1);
      }
    }
  }
}

// Host memory the core keeps beside the pool's blocks: an int32 position and a float score
// per stored token-head, and an int32 id per block.
double HostMetadataBytes(const PoolStatsSnapshot& stats) {
  return 8.0 * static_cast<double>(stats.stored_token_heads) +
         4.0 * static_cast<double>(stats.used_blocks);
}

double MemcpySeconds(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // touch both once
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, Since(t0));
    src[static_cast<size_t>(i)] = dst[static_cast<size_t>(i) + 1];
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const bool quick = absl::GetFlag(FLAGS_quick);
  const int layers = quick ? 2 : absl::GetFlag(FLAGS_layers);
  const int64_t tokens = quick ? 2048 : absl::GetFlag(FLAGS_tokens);
  const int budget = quick ? 256 : absl::GetFlag(FLAGS_budget);
  const int64_t attend_short = quick ? 512 : absl::GetFlag(FLAGS_attend_short);
  std::string json = "{";

  // 1. Bytes per token per format: store 1024 tokens, read the pool's byte count.
  std::printf(
      "== bytes per token (all %d layers x %d kv heads x head_dim %d, K+V): pool blocks, and "
      "the host metadata beside them (position + score per token-head, block ids)\n",
      layers, kHeads, kDim);
  std::printf("%-10s %14s %16s %10s %14s\n", "format", "pool B/token", "tokens per GiB", "vs f16",
              "host B/token");
  // f16 first: the other formats are reported against it.
  double f16_bytes = 0;
  json += "\"formats\": {";
  const int order[] = {1, 0, 2, 3, 4, 5, 6, 7};
  for (int f : order) {
    const auto format = static_cast<StorageFormat>(f);
    auto store = MakeStore(layers, int64_t{8} << 30);
    CreateSequenceParams cp;
    cp.policy.storage = format;
    cp.policy.storage_set = true;
    auto seq = store->CreateSequence(cp);
    constexpr int64_t kSample = 1024;
    Fill(*store, seq->id, layers, kSample);
    auto stats = store->stats().GetPoolStats("");
    const double per_token = static_cast<double>(stats->used_bytes) / kSample;
    const double host_per_token = HostMetadataBytes(*stats) / kSample;
    if (format == StorageFormat::kF16) f16_bytes = per_token;
    std::printf("%-10s %14.0f %16.0f %10s %14.0f\n", kvc::kernels::StorageFormatName(format),
                per_token, 1073741824.0 / per_token,
                f16_bytes > 0 ? absl::StrFormat("%.2fx", f16_bytes / per_token).c_str() : "-",
                host_per_token);
    json += absl::StrFormat("%s\"%s\": %.1f", f != 1 ? ", " : "",
                            kvc::kernels::StorageFormatName(format), per_token);
  }
  json += "}";

  // 2 + 3. SnapKV + INT4 on a long prompt, and the time Compress takes.
  auto store = MakeStore(layers, int64_t{12} << 30);
  auto seq = store->CreateSequence({});
  const auto t_fill = Clock::now();
  Fill(*store, seq->id, layers, tokens);
  const double fill_s = Since(t_fill);
  const int64_t raw_bytes = store->stats().GetPoolStats("")->used_bytes;
  const int64_t dense_bytes = 2 * tokens * layers * kHeads * kDim * 2;
  constexpr int kWindow = 32;
  std::vector<std::string> q(static_cast<size_t>(layers));
  CompressParams cp;
  cp.sequence_id = seq->id;
  cp.spec.eviction = CompressionSpec::Eviction::kSnapKv;
  cp.spec.window = kWindow;
  cp.spec.budget = budget;
  cp.spec.pooling_kernel = 7;
  cp.spec.storage = StorageFormat::kInt4G32;
  cp.spec.storage_set = true;
  cp.spec.residual_tokens = absl::GetFlag(FLAGS_residual);
  for (int l = 0; l < layers; ++l) {
    q[static_cast<size_t>(l)] = RandomF16(static_cast<size_t>(kWindow) * kQHeads * kDim, 100 + l);
    LayerQueries lq;
    lq.layer = l;
    lq.dtype = DType::kF16;
    lq.queries = q[static_cast<size_t>(l)];
    for (int t = 0; t < kWindow; ++t)
      lq.positions.push_back(static_cast<int32_t>(tokens - kWindow + t));
    cp.queries.push_back(lq);
  }
  const auto t_compress = Clock::now();
  auto compressed = store->Compress(cp);
  const double compress_s = Since(t_compress);
  const double host_after = HostMetadataBytes(*store->stats().GetPoolStats(""));
  if (!compressed.ok()) {
    std::fprintf(stderr, "compress: %s\n", compressed.status().ToString().c_str());
    return 1;
  }
  const double read_once_s = MemcpySeconds(static_cast<size_t>(dense_bytes));
  std::printf(
      "\n== SnapKV (window %d, budget %d, max pooling 7) + INT4 g32 (raw residual %d) on a "
      "%lld-token prompt\n",
      kWindow, budget, cp.spec.residual_tokens, static_cast<long long>(tokens));
  std::printf("  dense f16 KV          %12lld bytes\n", static_cast<long long>(dense_bytes));
  std::printf("  held before (f16)     %12lld bytes (prefill took %.2f s)\n",
              static_cast<long long>(raw_bytes), fill_s);
  std::printf("  held after            %12lld bytes -> %.1fx fewer than dense f16 (goal >= 26x)\n",
              static_cast<long long>(compressed->bytes_after),
              static_cast<double>(dense_bytes) / static_cast<double>(compressed->bytes_after));
  std::printf("  + host metadata       %12.0f bytes -> %.1fx counting both\n", host_after,
              static_cast<double>(dense_bytes) /
                  (static_cast<double>(compressed->bytes_after) + host_after));
  std::printf(
      "  Compress time         %.3f s; memcpy of the dense KV once %.3f s -> %.1fx (goal <= 3x)\n",
      compress_s, read_once_s, compress_s / read_once_s);
  json += absl::StrFormat(
      ", \"snapkv_int4\": {\"tokens\": %lld, \"budget\": %d, \"residual\": %d, "
      "\"dense_bytes\": %lld, "
      "\"bytes_after\": %lld, "
      "\"ratio\": %.2f, \"compress_s\": %.4f, \"memcpy_s\": %.4f, \"compress_vs_memcpy\": %.2f}",
      static_cast<long long>(tokens), budget, cp.spec.residual_tokens,
      static_cast<long long>(dense_bytes), static_cast<long long>(compressed->bytes_after),
      static_cast<double>(dense_bytes) / static_cast<double>(compressed->bytes_after), compress_s,
      read_once_s, compress_s / read_once_s);
  (void)store->Release(seq->id);

  // 4. Attend per decode step (one layer, all 32 query heads) at two stored lengths.
  std::printf("\n== Attend per decode step (one layer: 8 kv heads, 32 query heads, d 128)\n");
  std::printf("%-9s %-9s %12s %14s %12s\n", "stored", "format", "step (us)", "memcpy (us)",
              "ratio");
  json += ", \"attend\": [";
  bool first = true;
  for (int64_t stored : {attend_short, tokens}) {
    for (StorageFormat format : {StorageFormat::kF16, StorageFormat::kInt4G32}) {
      auto s2 = MakeStore(1, int64_t{4} << 30);
      CreateSequenceParams p2;
      p2.policy.storage = format;
      p2.policy.storage_set = true;
      auto seq2 = s2->CreateSequence(p2);
      Fill(*s2, seq2->id, 1, stored);
      const std::string query = RandomF16(kQHeads * kDim, 9);
      AttendParams a;
      a.sequence_id = seq2->id;
      a.layer = 0;
      a.queries = query;
      a.positions = {static_cast<int32_t>(stored)};
      (void)s2->Attend(a);  // warm
      double best = 1e9;
      for (int i = 0; i < 7; ++i) {
        const auto t0 = Clock::now();
        auto r = s2->Attend(a);
        best = std::min(best, Since(t0));
        if (!r.ok()) return 1;
      }
      const int64_t bytes = s2->stats().GetPoolStats("")->used_bytes;
      const double copy = MemcpySeconds(static_cast<size_t>(bytes));
      std::printf("%-9lld %-9s %12.0f %14.0f %11.2fx\n", static_cast<long long>(stored),
                  kvc::kernels::StorageFormatName(format), best * 1e6, copy * 1e6, best / copy);
      json += absl::StrFormat(
          "%s{\"stored\": %lld, \"format\": \"%s\", \"step_us\": %.1f, \"memcpy_us\": %.1f}",
          first ? "" : ", ", static_cast<long long>(stored),
          kvc::kernels::StorageFormatName(format), best * 1e6, copy * 1e6);
      first = false;
    }
  }
  json += "]}\n";
  if (!absl::GetFlag(FLAGS_json).empty()) std::ofstream(absl::GetFlag(FLAGS_json)) << json;
  return 0;
}
