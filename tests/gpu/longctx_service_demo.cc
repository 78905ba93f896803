// kvc_longctx_service_demo: the issue-#12 demo through the service core. One KvStore (the
// kvcached core, in-process) with a Llama-3-70B-shaped pool (80 layers, 8 KV heads, 64 query
// heads, head_dim 128, f16) on --device (default cuda:0) holds ONE sequence of --tokens
// (default 1,048,576) stored INT4 g32 from the first append, no eviction. The KV is
// synthetic and device-side: a background chunk is uploaded once and appended again and
// again straight from device memory (AppendParams::on_device; on a cpu pool from host
// memory), with --needles single-token needles planted at spread positions, each in one
// (layer, KV head): a key along the query direction whose logit beats a million background
// keys, and a one-hot value. Then --steps decode steps of KvStore::Attend over every layer;
// each needle's lane must return (nearly) its one-hot value and a needle-free lane must not.
// Reports fill throughput, the step time against a roofline (bytes the step reads / a
// device-to-device copy's bandwidth measured in the same run; the bound the kernels aim for,
// not a goal this path meets: Attend also moves each layer's H2O scores and block tables
// through PCIe, see docs/BENCHMARKS.md), and the pool bytes held against f16. JSON with
// --json. Exit 0 when every check passed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cachesvc/core/store/kv_store.h"
#include "kvc/kernels/block_layout.h"
#include "kvc/kernels/dtype.h"

ABSL_FLAG(std::string, device, "cuda:0", "the pool's device: cuda:N, or cpu");
ABSL_FLAG(int64_t, tokens, int64_t{1} << 20, "tokens of the one sequence");
ABSL_FLAG(int32_t, layers, 80, "layers (80 for Llama-3-70B)");
ABSL_FLAG(int32_t, needles, 8, "needles planted, each in one (layer, kv head)");
ABSL_FLAG(int32_t, steps, 3, "decode steps, each an Attend on every layer");
ABSL_FLAG(int32_t, chunk, 65536, "tokens per append");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");

namespace {

using kvc::cachesvc::AppendParams;
using kvc::cachesvc::AttendParams;
using kvc::cachesvc::BlockPool;
using kvc::cachesvc::KvStore;
using kvc::kernels::DType;
using kvc::kernels::StorageFormat;
using Clock = std::chrono::steady_clock;

constexpr int kHeads = 8, kQHeads = 64, kDim = 128;
constexpr float kQueryNorm = 8.0f, kNeedleNorm = 40.0f;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvc_longctx_service_demo: FAIL: %s\n", what.c_str());
  return 1;
}

struct Needle {
  int layer, head;
  int64_t position;
  int hot;  // the value's one-hot dimension
};

// [n, kHeads, kDim] f16 rows.
std::string ToF16(const std::vector<float>& v) {
  std::string out(v.size() * 2, '\0');
  kvc::kernels::ConvertElements(v.data(), DType::kF32, out.data(), DType::kF16, v.size());
  return out;
}

// Memory of the pool's backend holding `bytes` (device memory on a device pool).
struct Uploaded {
  BlockPool* pool = nullptr;
  void* data = nullptr;
  std::string host;  // a cpu pool's copy
  Uploaded() = default;
  Uploaded(const Uploaded&) = delete;
  Uploaded& operator=(const Uploaded&) = delete;
  ~Uploaded() {
    if (data != nullptr) pool->backend()->Free(data);
  }
  absl::string_view view(size_t offset, size_t bytes) const {
    if (data == nullptr) return absl::string_view(host).substr(offset, bytes);
    return absl::string_view(static_cast<const char*>(data) + offset, bytes);
  }
};

bool Upload(BlockPool* pool, bool on_device, std::string bytes, Uploaded* out) {
  out->pool = pool;
  if (!on_device) {
    out->host = std::move(bytes);
    return true;
  }
  kvc::kernels::KernelBackend* b = pool->backend();
  return b->Allocate(bytes.size(), &out->data).ok() &&
         b->CopyToDevice(out->data, bytes.data(), bytes.size(), {}).ok() && b->Synchronize({}).ok();
}

// Bytes per second of a device-to-device copy of `bytes` (0 when it cannot be measured).
double CopyBandwidth(BlockPool* pool, size_t bytes) {
  kvc::kernels::KernelBackend* b = pool->backend();
  void *src = nullptr, *dst = nullptr;
  double best = 0;
  if (b->Allocate(bytes, &src).ok() && b->Allocate(bytes, &dst).ok()) {
    for (int rep = 0; rep < 4; ++rep) {
      const auto t = Clock::now();
      if (!b->CopyOnDevice(dst, src, bytes, {}).ok() || !b->Synchronize({}).ok()) break;
      if (rep > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / Seconds(t));
    }
  }
  b->Free(src);
  b->Free(dst);
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int64_t chunk = std::min<int64_t>(absl::GetFlag(FLAGS_chunk), tokens);
  const int num_needles = std::clamp(absl::GetFlag(FLAGS_needles), 1, layers * kHeads);
  const bool on_device = device != "cpu";
  if (tokens < 16 || layers < 1 || steps < 1 || chunk < 1) return Fail("bad flags");

  // The pool: INT4 g32 blocks for every token, plus slack for slab edges.
  const auto int4 = kvc::kernels::MakeBlockLayout(StorageFormat::kInt4G32, kDim, 16);
  const int64_t blocks = (tokens + 15) / 16 * layers * kHeads;
  kvc::cachesvc::KvStoreOptions options;
  kvc::cachesvc::PoolOptions pool_options;
  pool_options.name = "llama3-70b";
  pool_options.device = device;
  pool_options.capacity_bytes =
      blocks * static_cast<int64_t>(int4.block_bytes) * 17 / 16 + (int64_t{64} << 20);
  pool_options.geometry = {layers, kHeads, kQHeads, kDim, 16, DType::kF16, {}};
  options.pools.push_back(pool_options);
  options.max_tokens_per_append = chunk;
  const double f16_bytes = 2.0 * 2.0 * kDim * kHeads * static_cast<double>(layers) * tokens;
  std::printf(
      "kvc_longctx_service_demo: %d layers x %d kv heads (%d query heads) x head_dim %d, "
      "%lld tokens INT4 g32 on %s; pool %.2f GiB (f16 would be %.2f GiB)\n",
      layers, kHeads, kQHeads, kDim, static_cast<long long>(tokens), device.c_str(),
      static_cast<double>(pool_options.capacity_bytes) / (1 << 30), f16_bytes / (1 << 30));
  auto store = KvStore::Create(options);
  if (!store.ok()) return Fail(store.status().ToString());
  BlockPool* pool = *(*store)->leases().FindPool("llama3-70b");
  kvc::cachesvc::CreateSequenceParams create;
  create.policy.storage = StorageFormat::kInt4G32;
  create.policy.storage_set = true;
  auto seq = (*store)->CreateSequence(create);
  if (!seq.ok()) return Fail(seq.status().ToString());

  // The query direction u (unit), shared by every query head; background keys are small and
  // random, so u.k stays near 0 for them while a needle's key is kNeedleNorm * u.
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> u(kDim);
  double norm = 0;
  for (float& x : u) {
    x = normal(rng);
    norm += x * x;
  }
  for (float& x : u) x = static_cast<float>(x / std::sqrt(norm));
  const size_t row = size_t{kHeads} * kDim;
  std::vector<float> bg_k(static_cast<size_t>(chunk) * row), bg_v(bg_k.size());
  for (size_t i = 0; i < bg_k.size(); ++i) {
    bg_k[i] = 0.1f * normal(rng);
    bg_v[i] = 0.05f * normal(rng);
  }
  Uploaded bk, bv;
  if (!Upload(pool, on_device, ToF16(bg_k), &bk) || !Upload(pool, on_device, ToF16(bg_v), &bv)) {
    return Fail("cannot upload the background chunk");
  }
  // Needles spread over layers, heads and depths (never at the last position: the query's).
  std::vector<Needle> needles;
  for (int i = 0; i < num_needles; ++i) {
    const int layer = static_cast<int>(static_cast<int64_t>(i) * layers / num_needles);
    needles.push_back(Needle{layer, i % kHeads, (tokens - 2) * (2 * i + 1) / (2 * num_needles),
                             (17 * i + 3) % kDim});
  }

  // Fill: per layer, background chunks with the layer's needles spliced in as 1-token appends.
  const auto fill_start = Clock::now();
  for (int l = 0; l < layers; ++l) {
    std::vector<const Needle*> mine;
    for (const Needle& n : needles) {
      if (n.layer == l) mine.push_back(&n);
    }
    int64_t pos = 0;
    size_t next = 0;
    while (pos < tokens) {
      int64_t n = std::min(chunk, tokens - pos);
      const bool needle = next < mine.size() && mine[next]->position == pos;
      if (next < mine.size() && !needle) n = std::min(n, mine[next]->position - pos);
      AppendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.start_position = pos;
      Uploaded nk, nv;
      if (needle) {
        // One token: background in every head but the needle's.
        std::vector<float> k(bg_k.begin(), bg_k.begin() + static_cast<std::ptrdiff_t>(row));
        std::vector<float> v(bg_v.begin(), bg_v.begin() + static_cast<std::ptrdiff_t>(row));
        const size_t h = static_cast<size_t>(mine[next]->head) * kDim;
        for (int d = 0; d < kDim; ++d) {
          k[h + static_cast<size_t>(d)] = kNeedleNorm * u[static_cast<size_t>(d)];
          v[h + static_cast<size_t>(d)] = d == mine[next]->hot ? 1.0f : 0.0f;
        }
        if (!Upload(pool, on_device, ToF16(k), &nk) || !Upload(pool, on_device, ToF16(v), &nv)) {
          return Fail("cannot upload a needle");
        }
        n = 1;
        a.keys = nk.view(0, row * 2);
        a.values = nv.view(0, row * 2);
        ++next;
      } else {
        a.keys = bk.view(0, static_cast<size_t>(n) * row * 2);
        a.values = bv.view(0, static_cast<size_t>(n) * row * 2);
      }
      a.num_tokens = n;
      a.on_device = on_device;
      auto appended = (*store)->Append(a);
      if (!appended.ok()) {
        return Fail(
            absl::StrCat("append of layer ", l, " at ", pos, ": ", appended.status().ToString()));
      }
      pos += n;
    }
  }
  const double fill_s = Seconds(fill_start);
  auto stats = (*store)->stats().GetPoolStats("llama3-70b");
  if (!stats.ok()) return Fail(stats.status().ToString());
  std::printf(
      "  filled    %.1f s (%.2f GB/s of f16 KV appended); pool holds %.2f GiB = f16 / %.2f\n",
      fill_s, f16_bytes / fill_s / 1e9, static_cast<double>(stats->used_bytes) / (1 << 30),
      f16_bytes / static_cast<double>(stats->used_bytes));

  // Decode: the same query (kQueryNorm * u in every query head) at the next position.
  std::vector<float> q(static_cast<size_t>(kQHeads) * kDim);
  for (int h = 0; h < kQHeads; ++h) {
    for (int d = 0; d < kDim; ++d) {
      q[static_cast<size_t>(h) * kDim + static_cast<size_t>(d)] =
          kQueryNorm * u[static_cast<size_t>(d)];
    }
  }
  std::string queries(q.size() * 4, '\0');
  std::memcpy(queries.data(), q.data(), queries.size());
  int found = 0, clean_lanes = 0, dirty_lanes = 0;
  double worst_needle = 0, worst_clean = 0, best_step = 1e30;
  for (int s = 0; s < steps; ++s) {
    const auto t = Clock::now();
    std::vector<std::vector<float>> outputs;
    for (int l = 0; l < layers; ++l) {
      AttendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.dtype = DType::kF32;
      a.queries = queries;
      a.positions = {static_cast<int32_t>(tokens)};
      auto r = (*store)->Attend(a);
      if (!r.ok()) return Fail(absl::StrCat("attend of layer ", l, ": ", r.status().ToString()));
      std::vector<float> out(q.size());
      std::memcpy(out.data(), r->output.data(), out.size() * 4);
      outputs.push_back(std::move(out));
    }
    best_step = std::min(best_step, Seconds(t));
    if (s > 0) continue;  // every step computes the same: check the first
    for (int l = 0; l < layers; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        const Needle* needle = nullptr;
        for (const Needle& n : needles) {
          if (n.layer == l && n.head == h) needle = &n;
        }
        // Every query head of the lane's group sees the same: check its first.
        const float* o = outputs[static_cast<size_t>(l)].data() +
                         static_cast<size_t>(h) * (kQHeads / kHeads) * kDim;
        if (needle != nullptr) {
          double err = 0;
          for (int d = 0; d < kDim; ++d) {
            err = std::max(err, std::fabs(o[d] - (d == needle->hot ? 1.0 : 0.0)));
          }
          worst_needle = std::max(worst_needle, err);
          if (err < 0.05) ++found;
        } else {
          double top = 0;
          for (int d = 0; d < kDim; ++d) top = std::max(top, std::fabs(static_cast<double>(o[d])));
          worst_clean = std::max(worst_clean, top);
          (top < 0.2 ? clean_lanes : dirty_lanes) += 1;
        }
      }
    }
  }
  // The roofline: one step reads every stored record once (the INT4 pool bytes).
  const double bandwidth = CopyBandwidth(pool, size_t{256} << 20);
  const double roofline_s =
      bandwidth > 0 ? static_cast<double>(stats->used_bytes) / bandwidth : 0.0;
  std::printf(
      "  decode    best step %.3f s over %d layers (roofline %.4f s at %.0f GB/s copy "
      "bandwidth: %.2fx of it)\n",
      best_step, layers, roofline_s, bandwidth / 1e9,
      roofline_s > 0 ? roofline_s / best_step : 0.0);
  std::printf(
      "  needles   %d of %d found (worst max-abs error %.4f); needle-free lanes %d clean, "
      "%d not (largest |output| %.4f)\n",
      found, num_needles, worst_needle, clean_lanes, dirty_lanes, worst_clean);
  const bool pass = found == num_needles && dirty_lanes == 0;
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << absl::StrFormat(
        R"({"device": "%s", "layers": %d, "kv_heads": %d, "query_heads": %d, "head_dim": %d,
  "tokens": %d, "storage": "int4_g32", "pool_used_bytes": %d, "f16_bytes": %.0f,
  "ratio_vs_f16": %.4f, "fill_seconds": %.3f, "best_step_seconds": %.6f,
  "copy_bandwidth_bytes_per_s": %.0f, "roofline_step_seconds": %.6f,
  "needles": %d, "needles_found": %d, "worst_needle_error": %.5f,
  "clean_lanes": %d, "dirty_lanes": %d, "pass": %s}
)",
        device, layers, kHeads, kQHeads, kDim, tokens, stats->used_bytes, f16_bytes,
        f16_bytes / static_cast<double>(stats->used_bytes), fill_s, best_step, bandwidth,
        roofline_s, num_needles, found, worst_needle, clean_lanes, dirty_lanes,
        pass ? "true" : "false");
  }
  std::printf("kvc_longctx_service_demo: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
