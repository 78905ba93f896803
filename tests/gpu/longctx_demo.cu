// kvc_longctx_demo — a KERNELS-LEVEL demo (not yet through kvcached): one 1,048,576-token
// sequence of a Llama-3-70B-shaped model (80 layers, 8 kv heads, 64 query heads, head_dim
// 128) stored INT4 (int4_g32: nibbles + f16 scale/zero per 32) in paged blocks of 16 tokens
// on ONE GPU, about 100 GiB, where f16 would need 320 GiB (344 GB). It
//   1. checks cudaMemGetInfo and scales the token count down, loudly, if the device is
//      smaller (or takes --tokens / KVC_DEMO_TOKENS to try it small);
//   2. fills every (layer, kv head) lane in-process from synthetic f16 K/V generated on the
//      device (WriteTokens quantizes them into the pool), planting N needles: single tokens
//      whose key is aligned with that lane's query direction and whose value is a known
//      +-0.75 pattern, one needle per chosen (layer, kv head);
//   3. runs decode steps: per layer one DecodeAttention over all stored tokens of its 8
//      lanes (64 query heads), timed with cudaEvents; the step's roofline is the KV bytes it
//      reads at the device-to-device copy bandwidth measured in the same run;
//   4. checks every needle: each of its 8 query heads' output equals the needle's value within
//      --tolerance, and the attention weight of the needle token is the lane's maximum and
//      above 0.9 (one extra DecodeAttention with weights on that lane alone); and, as a
//      negative control, that no lane without a needle produces a needle-sized output.
// Exit 0 when every check held; 1 on a failed check or any CUDA/kernel error; 2 on bad usage.
// Without a usable GPU: "SKIP: no CUDA device (<reason>)", exit 0. JSON with --json.
//
//   kvc_longctx_demo [--tokens N] [--layers L] [--steps S] [--needles K] [--tolerance X]
//                    [--json FILE] [--device N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpu_common.cuh"
#include "kvc/kernels/block_layout.h"

using namespace kvc::kernels;

namespace {

constexpr int kKvHeads = 8, kGroup = 8, kHeadDim = 128, kBlockTokens = 16;
constexpr StorageFormat kFormat = StorageFormat::kInt4G32;
constexpr int kMaxNeedles = 16;
constexpr float kNeedleKey = 2.0f;  // needle key = 2 * sign pattern: exact in int4 (min -2, max 2)
constexpr float kNeedleValue = 0.75f;  // needle value = +-0.75: exact in int4 likewise

struct Needle {
  int layer, head;
  int32_t token;
};
struct NeedleSet {
  int count;
  Needle n[kMaxNeedles];
};

// The query direction of (layer, kv head): a +-1 pattern. Every query head of the group is
// this direction plus 0.25 * noise, so the group attends to the same needle.
__host__ __device__ inline float Direction(int layer, int head, int j) {
  return (kvc::gpu::Mix64((static_cast<uint64_t>(layer) << 40) ^
                          (static_cast<uint64_t>(head) << 32) ^ static_cast<uint64_t>(j) ^
                          0xd1ull) >>
          63)
             ? 1.0f
             : -1.0f;
}
__host__ __device__ inline float NeedleValue(int needle, int j) {
  return (kvc::gpu::Mix64((static_cast<uint64_t>(needle) << 32) ^ static_cast<uint64_t>(j) ^
                          0x77ull) >>
          63)
             ? kNeedleValue
             : -kNeedleValue;
}

// Element i of tokens [t0, t0 + rows) of lane (layer, head): keys and values uniform in
// [-1, 1) except needle tokens (key = kNeedleKey * direction, value = NeedleValue), plus the
// destinations of the rows. Shared by the CUDA kernel and the CPU backend's host loop.
__host__ __device__ inline void GenerateElement(int layer, int head, int64_t t0, int64_t i,
                                                const NeedleSet& ns, const int32_t* lane_blocks,
                                                uint16_t* keys, uint16_t* values, int32_t* blocks,
                                                int32_t* slots) {
  const int64_t r = i / kHeadDim, t = t0 + r;
  const int j = static_cast<int>(i % kHeadDim);
  int needle = -1;
  for (int k = 0; k < ns.count; ++k)
    if (ns.n[k].layer == layer && ns.n[k].head == head && ns.n[k].token == t) needle = k;
  const uint64_t key = ((static_cast<uint64_t>(layer * kKvHeads + head)) << 44) ^
                       (static_cast<uint64_t>(t) << 8) ^ static_cast<uint64_t>(j);
  const float kf =
      needle >= 0 ? kNeedleKey * Direction(layer, head, j) : kvc::gpu::HashUniform(key * 2 + 0);
  const float vf = needle >= 0 ? NeedleValue(needle, j) : kvc::gpu::HashUniform(key * 2 + 1);
  keys[i] = FloatToHalf(kf);
  values[i] = FloatToHalf(vf);
  if (j == 0) {
    blocks[r] = lane_blocks[t / kBlockTokens];
    slots[r] = static_cast<int32_t>(t % kBlockTokens);
  }
}

__global__ void GenerateLaneKernel(int layer, int head, int64_t t0, int64_t rows, NeedleSet ns,
                                   const int32_t* lane_blocks, uint16_t* keys, uint16_t* values,
                                   int32_t* blocks, int32_t* slots) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * kHeadDim;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    GenerateElement(layer, head, t0, i, ns, lane_blocks, keys, values, blocks, slots);
  }
}

struct Args {
  int64_t tokens = 1 << 20;
  int layers = 80, steps = 5, needles = 8, device = 0;
  double tolerance = 0.02;
  bool cpu = false;   // run the same logic on the CPU backend (small sizes; no GPU needed)
  bool plan = false;  // print the sizing (and any scale-down) and stop before allocating
  std::string json_path;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  if (const char* env = std::getenv("KVC_DEMO_TOKENS")) a->tokens = std::atoll(env);
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const bool has = i + 1 < argc;
    if (s == "--tokens" && has)
      a->tokens = std::atoll(argv[++i]);
    else if (s == "--layers" && has)
      a->layers = std::atoi(argv[++i]);
    else if (s == "--steps" && has)
      a->steps = std::atoi(argv[++i]);
    else if (s == "--needles" && has)
      a->needles = std::atoi(argv[++i]);
    else if (s == "--tolerance" && has)
      a->tolerance = std::atof(argv[++i]);
    else if (s == "--json" && has)
      a->json_path = argv[++i];
    else if (s == "--backend" && has &&
             (std::string(argv[i + 1]) == "cpu" || std::string(argv[i + 1]) == "cuda"))
      a->cpu = std::string(argv[++i]) == "cpu";
    else if (s == "--plan")
      a->plan = true;
    else if (s == "--device" && has)
      a->device = std::atoi(argv[++i]);
    else
      return false;
  }
  return a->tokens >= 1024 && a->tokens <= (int64_t{1} << 24) && a->layers >= 1 &&
         a->layers <= 128 && a->steps >= 1 && a->steps <= 100 && a->needles >= 1 &&
         a->needles <= kMaxNeedles && a->needles <= a->layers * kKvHeads;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: %s [--tokens N (1024..16M; env KVC_DEMO_TOKENS)] [--layers L (1..128)] "
                 "[--steps S] [--needles K (1..%d)] [--tolerance X] [--json FILE] [--device N] "
                 "[--backend cuda|cpu] [--plan]\n",
                 argv[0], kMaxNeedles);
    return 2;
  }
  const auto wall0 = std::chrono::steady_clock::now();
  cudaDeviceProp prop{};
  std::string reason;
  if (a.cpu) {
    std::snprintf(prop.name, sizeof prop.name, "CPU backend (logic check, not the GPU demo)");
  } else if (!kvc::gpu::ProbeDevice(a.device, &reason, &prop)) {
    return kvc::gpu::Skip(reason, a.json_path);
  }
  std::unique_ptr<KernelBackend> backend;
  BackendOptions bo;
  bo.device = a.device;
  const KernelStatus created =
      CreateBackend(a.cpu ? BackendKind::kCpu : BackendKind::kCuda, bo, &backend);
  if (!created.ok()) {
    if (a.cpu) return kvc::gpu::KernelOk(created, "CreateBackend(cpu)") ? 0 : 1;
    return kvc::gpu::Skip(created.detail, a.json_path);
  }
  KernelBackend& b = *backend;
  using Buffer = kvc::gpu::BackendBuffer;

  // Copy bandwidth first, while the device is empty (2 x 2 GiB; 2 x 64 MiB on the CPU).
  const double copy_gbps =
      kvc::gpu::BackendCopyGbps(b, a.cpu ? size_t{64} << 20 : size_t{2} << 30, 3, 10);
  if (copy_gbps <= 0) return 1;

  const BlockLayout layout = MakeBlockLayout(kFormat, kHeadDim, kBlockTokens);
  const int64_t requested = a.tokens;
  // Bytes that scale with the token count: the pool, plus per call of the fill (f16 K and V
  // of one lane, its destinations) and of DecodeAttention (split-K partials: per 64 tokens
  // and query head, d + 2 floats; weights of one lane for the needle check).
  auto pool_bytes = [&](int64_t t) {
    return static_cast<double>(a.layers) * kKvHeads * ((t + kBlockTokens - 1) / kBlockTokens) *
           layout.block_bytes;
  };
  auto scratch_bytes = [&](int64_t t) {
    return t * (2.0 * kHeadDim * 2 + 8) + kKvHeads * (t / 64.0 + 1) * kGroup * (kHeadDim + 2) * 4 +
           kGroup * t * 4.0;
  };
  size_t free_b = 0, total_b = 0;
  if (a.cpu) {
    free_b = total_b = size_t{8} << 30;  // the CPU run is a logic check: cap it at 8 GiB
  } else if (!KVC_CUDA_OK(cudaMemGetInfo(&free_b, &total_b))) {
    return 1;
  }
  const double headroom = 1.5 * 1073741824.0;  // runtime, cudaMallocAsync pool, fragmentation
  bool scaled = false;
  while (a.tokens > 1024 && pool_bytes(a.tokens) + scratch_bytes(a.tokens) + headroom > free_b) {
    a.tokens = std::max<int64_t>(1024, a.tokens / 1024 * 1024 - 16 * 1024);
    scaled = true;
  }
  if (scaled) {
    std::printf(
        "\n*** SCALED DOWN: %lld tokens need %.1f GiB of pool + %.1f GiB scratch, the device has "
        "%.1f GiB free; running %lld tokens instead ***\n\n",
        static_cast<long long>(requested), pool_bytes(requested) / 1073741824.0,
        scratch_bytes(requested) / 1073741824.0, free_b / 1073741824.0,
        static_cast<long long>(a.tokens));
  }
  const int64_t T = a.tokens;
  const int32_t bpl = static_cast<int32_t>((T + kBlockTokens - 1) / kBlockTokens);
  const int64_t blocks_per_layer = int64_t{kKvHeads} * bpl;
  const size_t layer_bytes = static_cast<size_t>(blocks_per_layer) * layout.block_bytes;
  const double f16_bytes = static_cast<double>(a.layers) * kKvHeads * T * 2.0 * kHeadDim * 2;
  std::printf(
      "kvc_longctx_demo (kernels level): %s, %.1f GiB free of %.1f; %d layers x %d kv "
      "heads x %lld tokens, %s, pool %.2f GiB (f16 would be %.2f GiB), copy %.0f GB/s\n",
      prop.name, free_b / 1073741824.0, total_b / 1073741824.0, a.layers, kKvHeads,
      static_cast<long long>(T), StorageFormatName(kFormat), pool_bytes(T) / 1073741824.0,
      f16_bytes / 1073741824.0, copy_gbps);
  if (a.plan) {
    std::printf("plan only (--plan): pool %.0f bytes + scratch %.0f bytes of %zu free; %s\n",
                pool_bytes(T), scratch_bytes(T), free_b, scaled ? "SCALED DOWN" : "full size");
    return 0;
  }

  // Needles: distinct (layer, kv head) lanes spread over the layers (heads rotating), tokens
  // spread over the sequence, the first near its start and the last near its end.
  NeedleSet ns{};
  ns.count = a.needles;
  for (int k = 0; k < a.needles; ++k) {
    if (a.needles <= a.layers) {  // distinct layers
      ns.n[k].layer = static_cast<int>(static_cast<int64_t>(k) * a.layers / a.needles);
      ns.n[k].head = (k * 3) % kKvHeads;
    } else {  // distinct lanes (ParseArgs bounds needles by layers * kv heads)
      const int lane = static_cast<int>(static_cast<int64_t>(k) * a.layers * kKvHeads / a.needles);
      ns.n[k].layer = lane / kKvHeads;
      ns.n[k].head = lane % kKvHeads;
    }
    ns.n[k].token = static_cast<int32_t>(std::min<int64_t>(
        T - 1,
        (T - 1) * k / std::max(1, a.needles - 1) + static_cast<int64_t>(kvc::gpu::Mix64(k) % 997)));
  }

  // One arena holding every layer (layer l's blocks at l * layer_bytes); one lane table
  // shared by all layers, its block ids a fixed permutation within the layer (a pool after
  // churn scatters a lane's blocks).
  Buffer pool(b), offsets(b), ids(b), ntok(b), queries(b), out(b), weights(b), gen_k(b), gen_v(b),
      gen_b(b), gen_s(b);
  std::vector<int32_t> h_offsets(kKvHeads + 1), h_ids(static_cast<size_t>(blocks_per_layer));
  for (int i = 0; i <= kKvHeads; ++i) h_offsets[i] = i * bpl;
  for (size_t i = 0; i < h_ids.size(); ++i) h_ids[i] = static_cast<int32_t>(i);
  for (size_t i = h_ids.size() - 1; i > 0; --i)
    std::swap(h_ids[i], h_ids[kvc::gpu::Mix64(i + 12345) % (i + 1)]);
  std::vector<uint16_t> h_q(static_cast<size_t>(a.layers) * kKvHeads * kGroup * kHeadDim);
  for (int layer = 0; layer < a.layers; ++layer)
    for (int h = 0; h < kKvHeads; ++h)
      for (int g = 0; g < kGroup; ++g)
        for (int j = 0; j < kHeadDim; ++j) {
          const size_t i =
              ((static_cast<size_t>(layer) * kKvHeads + h) * kGroup + g) * kHeadDim + j;
          h_q[i] =
              FloatToHalf(Direction(layer, h, j) + 0.25f * kvc::gpu::HashUniform(i ^ 0xabcull));
        }
  const auto alloc0 = std::chrono::steady_clock::now();
  bool ok = pool.Allocate(layer_bytes * a.layers, "the pool") &&
            offsets.Upload(h_offsets, "block offsets") && ids.Upload(h_ids, "block ids") &&
            ntok.Upload(std::vector<int32_t>(kKvHeads, static_cast<int32_t>(T)), "num tokens") &&
            queries.Upload(h_q, "queries") && out.Allocate(h_q.size() * 2, "outputs") &&
            weights.Allocate(static_cast<size_t>(kGroup) * T * 4, "needle weights") &&
            gen_k.Allocate(static_cast<size_t>(T) * kHeadDim * 2, "generated keys") &&
            gen_v.Allocate(static_cast<size_t>(T) * kHeadDim * 2, "generated values") &&
            gen_b.Allocate(static_cast<size_t>(T) * 4, "generated blocks") &&
            gen_s.Allocate(static_cast<size_t>(T) * 4, "generated slots");
  if (!ok) {
    std::printf("FAIL: allocation (see stderr)\n");
    return 1;
  }
  auto arena_of = [&](int layer) {
    return PagedArena{pool.get<uint8_t>() + layer_bytes * layer, layout,
                      static_cast<int32_t>(blocks_per_layer)};
  };

  // Fill: one lane (1 << 20 rows at full size) per generate + WriteTokens.
  const auto fill0 = std::chrono::steady_clock::now();
  for (int layer = 0; ok && layer < a.layers; ++layer) {
    for (int h = 0; ok && h < kKvHeads; ++h) {
      if (a.cpu) {
        for (int64_t i = 0; i < T * kHeadDim; ++i)
          GenerateElement(layer, h, 0, i, ns, ids.get<int32_t>() + h_offsets[h],
                          gen_k.get<uint16_t>(), gen_v.get<uint16_t>(), gen_b.get<int32_t>(),
                          gen_s.get<int32_t>());
      } else {
        GenerateLaneKernel<<<2048, 256>>>(layer, h, 0, T, ns, ids.get<int32_t>() + h_offsets[h],
                                          gen_k.get<uint16_t>(), gen_v.get<uint16_t>(),
                                          gen_b.get<int32_t>(), gen_s.get<int32_t>());
        ok = KVC_CUDA_OK(cudaGetLastError());
      }
      WriteTokensArgs w;
      w.arena = arena_of(layer);
      w.num_rows = static_cast<int32_t>(T);
      w.dtype = DType::kF16;
      w.keys = gen_k.get();
      w.values = gen_v.get();
      w.dst_blocks = gen_b.get<int32_t>();
      w.dst_slots = gen_s.get<int32_t>();
      ok = ok && kvc::gpu::KernelOk(b.WriteTokens(w, StreamHandle{}), "WriteTokens");
    }
  }
  ok = ok && kvc::gpu::KernelOk(b.Synchronize(StreamHandle{}), "Synchronize");
  const double fill_s = Seconds(fill0);
  gen_k.Reset(), gen_v.Reset(), gen_b.Reset(), gen_s.Reset();
  if (!ok) {
    std::printf("FAIL: fill (see stderr)\n");
    return 1;
  }
  std::printf("filled %lld tokens x %d lanes in %.2f s (%.0f GB of f16 K/V quantized)\n",
              static_cast<long long>(T), a.layers * kKvHeads, fill_s, f16_bytes / 1e9);

  const LaneTable table{kKvHeads, offsets.get<int32_t>(), ids.get<int32_t>(), ntok.get<int32_t>(),
                        static_cast<int32_t>(T)};
  auto decode_layer = [&](int layer) {
    DecodeAttentionArgs d;
    d.arena = arena_of(layer);
    d.lanes = table;
    d.group_size = kGroup;
    d.dtype = DType::kF16;
    d.queries = queries.get<uint16_t>() + static_cast<size_t>(layer) * kKvHeads * kGroup * kHeadDim;
    d.out = out.get<uint16_t>() + static_cast<size_t>(layer) * kKvHeads * kGroup * kHeadDim;
    return kvc::gpu::KernelOk(b.DecodeAttention(d, StreamHandle{}), "DecodeAttention");
  };
  auto step = [&] {
    bool s = true;
    for (int layer = 0; s && layer < a.layers; ++layer) s = decode_layer(layer);
    return s;
  };
  const double step_ms = kvc::gpu::BackendMedianMs(b, step, 1, a.steps);
  if (step_ms <= 0) {
    std::printf("FAIL: decode (see stderr)\n");
    return 1;
  }
  const double read_bytes =
      static_cast<double>(a.layers) * kKvHeads * T * 2.0 * layout.record_bytes;
  const double roofline_ms = read_bytes / (copy_gbps * 1e9) * 1e3;
  std::printf(
      "decode step (%d layers x DecodeAttention over %lld tokens, 64 query heads): "
      "%.2f ms median of %d; roofline %.2f ms (%.1f GB at %.0f GB/s): %.2fx of roofline\n",
      a.layers, static_cast<long long>(T), step_ms, a.steps, roofline_ms, read_bytes / 1e9,
      copy_gbps, roofline_ms / step_ms);

  // Checks on the last step's outputs.
  std::vector<uint16_t> h_out(h_q.size());
  if (!out.Download(&h_out, "outputs")) return 1;
  auto out_at = [&](int layer, int h, int g, int j) {
    return HalfToFloat(
        h_out[((static_cast<size_t>(layer) * kKvHeads + h) * kGroup + g) * kHeadDim + j]);
  };
  kvc::gpu::Json j;
  j.Open('{').Key("demo").Str("kernels-level 1M-token Llama-3-70B-shaped INT4 sequence");
  j.Key("device").Str(prop.name).Key("layers").Num(a.layers).Key("kv_heads").Num(kKvHeads);
  j.Key("query_heads").Num(kKvHeads * kGroup).Key("head_dim").Num(kHeadDim);
  j.Key("format").Str(StorageFormatName(kFormat)).Key("block_tokens").Num(kBlockTokens);
  j.Key("tokens_requested")
      .Num(static_cast<double>(requested))
      .Key("tokens")
      .Num(static_cast<double>(T));
  j.Key("scaled_down").Bool(scaled);
  j.Key("pool_bytes").Num(pool_bytes(T)).Key("f16_bytes").Num(f16_bytes);
  j.Key("bytes_vs_f16").Num(pool_bytes(T) / f16_bytes);
  j.Key("device_free_bytes_before").Num(static_cast<double>(free_b));
  j.Key("copy_gbps").Num(copy_gbps).Key("fill_seconds").Num(fill_s);
  j.Key("step_ms").Num(step_ms).Key("steps").Num(a.steps).Key("roofline_ms").Num(roofline_ms);
  j.Key("roofline_ratio").Num(roofline_ms / step_ms).Key("kv_bytes_read_per_step").Num(read_bytes);
  j.Key("needles").Open('[');
  int failures = 0;
  std::vector<bool> has_needle(static_cast<size_t>(a.layers) * kKvHeads, false);
  for (int k = 0; k < ns.count; ++k) {
    const Needle& n = ns.n[k];
    has_needle[static_cast<size_t>(n.layer) * kKvHeads + n.head] = true;
    double max_err = 0;
    for (int g = 0; g < kGroup; ++g)
      for (int jj = 0; jj < kHeadDim; ++jj)
        max_err = std::max(max_err, std::fabs(static_cast<double>(out_at(n.layer, n.head, g, jj)) -
                                              NeedleValue(k, jj)));
    // Weights of this lane alone: a one-lane table over the same blocks.
    Buffer one_offsets(b), one_out(b);
    ok = one_offsets.Upload(std::vector<int32_t>{0, bpl}, "one-lane offsets");
    ok = ok && one_out.Allocate(kGroup * kHeadDim * 2, "one-lane output");
    DecodeAttentionArgs d;
    d.arena = arena_of(n.layer);
    d.lanes = LaneTable{1, one_offsets.get<int32_t>(), ids.get<int32_t>() + h_offsets[n.head],
                        ntok.get<int32_t>(), static_cast<int32_t>(T)};
    d.group_size = kGroup;
    d.dtype = DType::kF16;
    d.queries = queries.get<uint16_t>() +
                (static_cast<size_t>(n.layer) * kKvHeads + n.head) * kGroup * kHeadDim;
    d.out = one_out.get();
    d.weights = weights.get<float>();
    ok = ok && kvc::gpu::KernelOk(b.DecodeAttention(d, StreamHandle{}), "DecodeAttention+weights");
    std::vector<float> w(static_cast<size_t>(kGroup) * T);
    ok = ok && weights.Download(&w, "needle weights");
    if (!ok) return 1;
    double min_weight = 1;
    bool argmax_ok = true;
    for (int g = 0; g < kGroup; ++g) {
      const float* row = w.data() + static_cast<size_t>(g) * T;
      const int64_t arg = std::max_element(row, row + T) - row;
      argmax_ok = argmax_ok && arg == n.token;
      min_weight = std::min<double>(min_weight, row[n.token]);
    }
    const bool found = max_err <= a.tolerance && argmax_ok && min_weight > 0.9;
    if (!found) ++failures;
    std::printf(
        "needle %d: layer %d kv head %d token %d: output max err %.4f (tol %.3f), "
        "weight %.4f (min over 8 heads), argmax %s: %s\n",
        k, n.layer, n.head, n.token, max_err, a.tolerance, min_weight,
        argmax_ok ? "at the needle" : "ELSEWHERE", found ? "FOUND" : "NOT FOUND");
    j.Open('{').Key("layer").Num(n.layer).Key("kv_head").Num(n.head).Key("token").Num(n.token);
    j.Key("max_abs_err").Num(max_err).Key("min_weight").Num(min_weight);
    j.Key("argmax_at_needle").Bool(argmax_ok).Key("found").Bool(found).Close('}');
  }
  j.Close(']');
  // Negative control: lanes without a needle attend almost uniformly to +-1 noise, so their
  // outputs stay near 0; a needle-sized output there would mean lanes or layers got mixed up.
  double control_max = 0;
  for (int layer = 0; layer < a.layers; ++layer)
    for (int h = 0; h < kKvHeads; ++h) {
      if (has_needle[static_cast<size_t>(layer) * kKvHeads + h]) continue;
      for (int g = 0; g < kGroup; ++g)
        for (int jj = 0; jj < kHeadDim; ++jj)
          control_max = std::max<double>(control_max, std::fabs(out_at(layer, h, g, jj)));
    }
  const bool control_ok = control_max < 0.3 * kNeedleValue;
  if (!control_ok) ++failures;
  std::printf("control: max |output| of lanes without a needle %.4f (< %.3f): %s\n", control_max,
              0.3 * kNeedleValue, control_ok ? "ok" : "FAILED");
  // Free everything and check that the device is still healthy before saying PASS.
  pool.Reset(), weights.Reset();
  ok = kvc::gpu::KernelOk(b.Synchronize(StreamHandle{}), "Synchronize") &&
       (a.cpu || KVC_CUDA_OK(cudaGetLastError()));
  const double wall_s = Seconds(wall0);
  j.Key("control_max_abs").Num(control_max).Key("control_ok").Bool(control_ok);
  j.Key("alloc_to_end_seconds").Num(Seconds(alloc0)).Key("wall_seconds").Num(wall_s);
  j.Key("failures").Num(failures).Key("pass").Bool(failures == 0 && ok).Close('}');
  if (!j.WriteTo(a.json_path)) {
    std::fprintf(stderr, "cannot write %s\n", a.json_path.c_str());
    ok = false;
  }
  std::printf("kvc_longctx_demo: %s (%d of %d needles found, %.1f s wall)\n",
              failures == 0 && ok ? "PASS" : "FAIL", a.needles - std::min(failures, a.needles),
              a.needles, wall_s);
  return failures == 0 && ok ? 0 : 1;
}
