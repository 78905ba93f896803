// kvc_gpu_bench: the kernels' GPU figures as ratios against a baseline measured in the same
// run (cudaEvent timing, warm-up, median of N), written as JSON. Kernels-level only (no
// gRPC): builds in the standalone kernels/ build. Goals are from issue #12:
//   quantize/<fmt>, dequantize/<fmt>  WriteTokens / ReadTokens vs a device-to-device copy of
//                                     the same traffic (bytes read + written): ratio =
//                                     copy time / op time, goal >= 0.8
//   decode_llama8b_batch16x8192/<fmt> one decode step of one layer of a Llama-3-8B batch (16
//                                     sequences x 8 kv heads x 8192 tokens, 32 query heads)
//                                     vs its memory roofline (KV bytes read / measured copy
//                                     bandwidth): ratio = roofline time / op time, goal >= 0.7
//   snapkv_llama8b_32k/<fmt>          SnapKvScore + Select + compaction + Gather of one 32K-token
//                                     Llama-3-8B-shaped sequence (32 layers x 8 kv heads = 256
//                                     lanes, head_dim 128, GQA 4, window 32, kept 4096 per lane)
//                                     vs one read of its KV at copy bandwidth: ratio = op time /
//                                     read time, goal <= 3
// A missed goal is reported (stdout "GOAL MISSED", JSON "met": false), not an error: exit 0
// when every op ran and every self-check held, 1 on an error, 2 on bad usage. Without a
// usable GPU: prints "SKIP: no CUDA device (<reason>)" and exits 0.
//
//   kvc_gpu_bench [--quick] [--reps N] [--filter S] [--json FILE] [--device N]
//
// --quick shrinks every case (small geometry, 3 reps) for a smoke run.
#include <cstdio>
#include <cstring>
#include <cub/block/block_scan.cuh>
#include <memory>
#include <string>
#include <vector>

#include "bench_cases.h"
#include "gpu_common.cuh"
#include "kvc/kernels/block_layout.h"

using namespace kvc::kernels;
using Buffer = kvc::gpu::BackendBuffer;
using kvc::gpu::Json;

namespace {

struct Options {
  bool quick = false;
  bool cpu = false;  // --backend cpu: the same cases on the CPU backend (a logic check)
  int reps = 20, warmup = 3, device = 0;
  std::string filter, json_path;
};

struct Result {
  std::string name, baseline, counted;
  double bytes = 0, op_ms = 0, baseline_ms = 0, ratio = 0, goal = 0;
  bool higher_is_better = true;  // ratio >= goal, else ratio <= goal
  bool met() const { return higher_is_better ? ratio >= goal : ratio <= goal; }
  std::vector<std::pair<std::string, double>> extra;  // stage times and the like
};

// Times one case of tests/kernels/bench (its Run() enqueues on the default stream) and a
// D2D copy of the same traffic; MakeCopyRun(bytes) copies bytes / 2 so that read + write
// equals `bytes`.
bool TimeBenchCase(KernelBackend& b, const bench::BenchCase& c, const Options& o, double goal,
                   const char* baseline, Result* r) {
  KernelStatus st = KernelStatus::Ok();
  auto run = c.make(b, &st);
  if (!kvc::gpu::KernelOk(st, c.name.c_str())) return false;
  r->name = c.name;
  r->bytes = run->Bytes();
  r->counted = run->Counted();
  r->op_ms = kvc::gpu::BackendMedianMs(
      b, [&] { return kvc::gpu::KernelOk(run->Run(), c.name.c_str()); }, o.warmup, o.reps);
  run.reset();  // free the case's buffers before the copy allocates its own
  if (r->op_ms <= 0) return false;
  auto copy = bench::MakeCopyRun(b, r->bytes, 1, &st);
  if (!kvc::gpu::KernelOk(st, "copy baseline")) return false;
  r->baseline_ms = kvc::gpu::BackendMedianMs(
      b, [&] { return kvc::gpu::KernelOk(copy->Run(), "copy baseline"); }, o.warmup, o.reps);
  if (r->baseline_ms <= 0) return false;
  r->baseline = baseline;
  r->ratio = r->baseline_ms / r->op_ms;
  r->goal = goal;
  r->higher_is_better = true;
  return true;
}

// Per lane, the stored indices whose keep flag is set, in order, become Gather rows: source
// (the lane's block, slot) to destination (lane * dst_blocks_per_lane + k / block_tokens,
// k % block_tokens). A lane that keeps fewer than kept_per_lane tokens gets its remaining
// rows pointed at distinct unused destinations (so Gather stays in bounds and race-free) and
// its count says so; the caller checks the counts.
constexpr int kCompactThreads = 1024;
__global__ void CompactKeptKernel(const uint8_t* keep, int32_t max_tokens,
                                  const int32_t* num_tokens, const int32_t* block_offsets,
                                  const int32_t* block_ids, int block_tokens, int32_t kept_per_lane,
                                  int32_t dst_blocks_per_lane, int32_t* src_b, int32_t* src_s,
                                  int32_t* dst_b, int32_t* dst_s, int32_t* counts) {
  using Scan = cub::BlockScan<int, kCompactThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int base;
  const int32_t lane = blockIdx.x, n = num_tokens[lane];
  const int32_t* ids = block_ids + block_offsets[lane];
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int32_t t0 = 0; t0 < n; t0 += kCompactThreads) {
    const int32_t t = t0 + threadIdx.x;
    const int flag = (t < n && keep[static_cast<size_t>(lane) * max_tokens + t] != 0) ? 1 : 0;
    int pos = 0, total = 0;
    Scan(tmp).ExclusiveSum(flag, pos, total);
    const int k = base + pos;
    if (flag && k < kept_per_lane) {
      const size_t row = static_cast<size_t>(lane) * kept_per_lane + k;
      src_b[row] = ids[t / block_tokens];
      src_s[row] = t % block_tokens;
      dst_b[row] = lane * dst_blocks_per_lane + k / block_tokens;
      dst_s[row] = k % block_tokens;
    }
    __syncthreads();  // everyone has read `base` and tmp before they change
    if (threadIdx.x == 0) base += total;
    __syncthreads();
  }
  for (int k = base + threadIdx.x; k < kept_per_lane; k += blockDim.x) {
    const size_t row = static_cast<size_t>(lane) * kept_per_lane + k;
    src_b[row] = ids[0];
    src_s[row] = 0;
    dst_b[row] = lane * dst_blocks_per_lane + k / block_tokens;
    dst_s[row] = k % block_tokens;
  }
  if (threadIdx.x == 0) counts[lane] = base;
}

// CompactKeptKernel's rows for host memory (the CPU backend): the logic check of --backend cpu.
void CompactKeptHost(const uint8_t* keep, int32_t lanes, int32_t max_tokens,
                     const int32_t* num_tokens, const int32_t* block_offsets,
                     const int32_t* block_ids, int block_tokens, int32_t kept_per_lane,
                     int32_t dst_blocks_per_lane, int32_t* src_b, int32_t* src_s, int32_t* dst_b,
                     int32_t* dst_s, int32_t* counts) {
  for (int32_t lane = 0; lane < lanes; ++lane) {
    const int32_t* ids = block_ids + block_offsets[lane];
    int k = 0;
    for (int32_t t = 0; t < num_tokens[lane]; ++t) {
      if (keep[static_cast<size_t>(lane) * max_tokens + t] == 0) continue;
      if (k < kept_per_lane) {
        const size_t row = static_cast<size_t>(lane) * kept_per_lane + k;
        src_b[row] = ids[t / block_tokens], src_s[row] = t % block_tokens;
        dst_b[row] = lane * dst_blocks_per_lane + k / block_tokens, dst_s[row] = k % block_tokens;
      }
      ++k;
    }
    counts[lane] = k;
    for (; k < kept_per_lane; ++k) {
      const size_t row = static_cast<size_t>(lane) * kept_per_lane + k;
      src_b[row] = ids[0], src_s[row] = 0;
      dst_b[row] = lane * dst_blocks_per_lane + k / block_tokens, dst_s[row] = k % block_tokens;
    }
  }
}

// SnapKV compression of one sequence, as the service's Compress would run it on a device
// pool: score every stored token of every (layer, kv head) lane from the last `window`
// queries, select sinks + recent + budget per lane, turn the keep mask into Gather rows on
// the device, and copy the kept records into fresh blocks of a second arena.
bool SnapKvPipeline(KernelBackend& b, StorageFormat f, const Options& o, Result* r) {
  const int layers = o.quick ? 2 : 32, kv_heads = 8, group = 4, d = 128, window = 32;
  const int tokens = o.quick ? 4096 : 32768, bt = 16;
  const int sinks = 4, recent = window, kept = o.quick ? 1024 : 4096;
  const int budget = kept - sinks - recent;
  const int lanes = layers * kv_heads, bpl = tokens / bt, dst_bpl = kept / bt;
  const BlockLayout l = MakeBlockLayout(f, d, bt);
  const size_t lane_tokens = static_cast<size_t>(lanes) * tokens;

  Buffer arena(b), dst_arena(b), offsets(b), ids(b), ntok(b), kpos(b), qpos(b), queries(b),
      scores(b), keep(b), src_b(b), src_s(b), dst_b(b), dst_s(b), counts(b), fill_k(b), fill_v(b),
      fill_b(b), fill_s(b);
  std::vector<int32_t> h_offsets(lanes + 1), h_ids(static_cast<size_t>(lanes) * bpl),
      h_kpos(lane_tokens), h_qpos(static_cast<size_t>(lanes) * window);
  for (int i = 0; i <= lanes; ++i) h_offsets[i] = i * bpl;
  for (size_t i = 0; i < h_ids.size(); ++i) h_ids[i] = static_cast<int32_t>(i);
  // Scatter the blocks over the arena, as in a pool after churn (a fixed permutation).
  for (size_t i = h_ids.size() - 1; i > 0; --i)
    std::swap(h_ids[i], h_ids[kvc::gpu::Mix64(i) % (i + 1)]);
  for (int lane = 0; lane < lanes; ++lane) {
    for (int t = 0; t < tokens; ++t) h_kpos[static_cast<size_t>(lane) * tokens + t] = t;
    for (int w = 0; w < window; ++w)
      h_qpos[static_cast<size_t>(lane) * window + w] = tokens - window + w;
  }
  const size_t chunk_lanes = 32;  // fill 32 lanes (1M rows at 32K) per WriteTokens
  const size_t chunk_rows = chunk_lanes * tokens;
  bool ok = arena.Allocate(static_cast<size_t>(lanes) * bpl * l.block_bytes, "snapkv arena") &&
            dst_arena.Allocate(static_cast<size_t>(lanes) * dst_bpl * l.block_bytes,
                               "snapkv destination arena") &&
            offsets.Upload(h_offsets, "block offsets") && ids.Upload(h_ids, "block ids") &&
            ntok.Upload(std::vector<int32_t>(lanes, tokens), "num tokens") &&
            kpos.Upload(h_kpos, "key positions") && qpos.Upload(h_qpos, "query positions") &&
            queries.Allocate(static_cast<size_t>(lanes) * group * window * d * 2, "queries") &&
            scores.Allocate(lane_tokens * 4, "scores") && keep.Allocate(lane_tokens, "keep") &&
            src_b.Allocate(static_cast<size_t>(lanes) * kept * 4, "rows") &&
            src_s.Allocate(static_cast<size_t>(lanes) * kept * 4, "rows") &&
            dst_b.Allocate(static_cast<size_t>(lanes) * kept * 4, "rows") &&
            dst_s.Allocate(static_cast<size_t>(lanes) * kept * 4, "rows") &&
            counts.Allocate(static_cast<size_t>(lanes) * 4, "counts") &&
            fill_k.Allocate(chunk_rows * d * 2, "fill keys") &&
            fill_v.Allocate(chunk_rows * d * 2, "fill values") &&
            fill_b.Allocate(chunk_rows * 4, "fill blocks") &&
            fill_s.Allocate(chunk_rows * 4, "fill slots");
  if (!ok) return false;
  ok = kvc::gpu::FillHalfOn(b, queries.get(), static_cast<int64_t>(lanes) * group * window, d, 11,
                            1.0f);
  PagedArena a{arena.get(), l, lanes * bpl};
  for (int lane0 = 0; ok && lane0 < lanes; lane0 += static_cast<int>(chunk_lanes)) {
    const int n = std::min<int>(static_cast<int>(chunk_lanes), lanes - lane0);
    ok = kvc::gpu::FillHalfOn(b, fill_k.get(), static_cast<int64_t>(n) * tokens, d, 100 + lane0,
                              1.0f) &&
         kvc::gpu::FillHalfOn(b, fill_v.get(), static_cast<int64_t>(n) * tokens, d, 200 + lane0,
                              1.0f);
    for (int i = 0; ok && i < n; ++i) {
      ok = kvc::gpu::LaneSlotsOn(b, ids.get<int32_t>() + static_cast<size_t>(lane0 + i) * bpl, bt,
                                 0, tokens, fill_b.get<int32_t>() + static_cast<size_t>(i) * tokens,
                                 fill_s.get<int32_t>() + static_cast<size_t>(i) * tokens);
    }
    WriteTokensArgs w;
    w.arena = a;
    w.num_rows = n * tokens;
    w.dtype = DType::kF16;
    w.keys = fill_k.get();
    w.values = fill_v.get();
    w.dst_blocks = fill_b.get<int32_t>();
    w.dst_slots = fill_s.get<int32_t>();
    ok = ok && kvc::gpu::KernelOk(b.WriteTokens(w, StreamHandle{}), "WriteTokens (fill)");
  }
  ok = ok && kvc::gpu::KernelOk(b.Synchronize(StreamHandle{}), "Synchronize");
  fill_k.Reset(), fill_v.Reset(), fill_b.Reset(), fill_s.Reset();
  if (!ok) return false;

  const LaneTable table{lanes, offsets.get<int32_t>(), ids.get<int32_t>(), ntok.get<int32_t>(),
                        tokens};
  SnapKvScoreArgs sa;
  sa.arena = a;
  sa.lanes = table;
  sa.group_size = group;
  sa.window = window;
  sa.query_dtype = DType::kF16;
  sa.queries = queries.get();
  sa.query_positions = qpos.get<int32_t>();
  sa.key_positions = kpos.get<int32_t>();
  sa.pool_kernel = 7;
  sa.pool = PoolKind::kMax;
  sa.scores = scores.get<float>();
  SelectArgs se;
  se.num_lanes = lanes;
  se.num_tokens = ntok.get<int32_t>();
  se.max_tokens = tokens;
  se.positions = kpos.get<int32_t>();
  se.scores = scores.get<float>();
  se.sinks = sinks;
  se.recent = recent;
  se.budget = budget;
  se.keep = keep.get<uint8_t>();
  GatherArgs ga;
  ga.src = a;
  ga.dst = PagedArena{dst_arena.get(), l, lanes * dst_bpl};
  ga.num_rows = lanes * kept;
  ga.src_blocks = src_b.get<int32_t>();
  ga.src_slots = src_s.get<int32_t>();
  ga.dst_blocks = dst_b.get<int32_t>();
  ga.dst_slots = dst_s.get<int32_t>();
  auto score = [&] { return kvc::gpu::KernelOk(b.SnapKvScore(sa, StreamHandle{}), "SnapKvScore"); };
  auto select = [&] { return kvc::gpu::KernelOk(b.Select(se, StreamHandle{}), "Select"); };
  auto compact = [&] {
    if (b.kind() != BackendKind::kCuda) {  // the same rows, on the host (CPU backend memory)
      CompactKeptHost(keep.get<uint8_t>(), lanes, tokens, ntok.get<int32_t>(),
                      offsets.get<int32_t>(), ids.get<int32_t>(), bt, kept, dst_bpl,
                      src_b.get<int32_t>(), src_s.get<int32_t>(), dst_b.get<int32_t>(),
                      dst_s.get<int32_t>(), counts.get<int32_t>());
      return true;
    }
    CompactKeptKernel<<<lanes, kCompactThreads>>>(
        keep.get<uint8_t>(), tokens, ntok.get<int32_t>(), offsets.get<int32_t>(),
        ids.get<int32_t>(), bt, kept, dst_bpl, src_b.get<int32_t>(), src_s.get<int32_t>(),
        dst_b.get<int32_t>(), dst_s.get<int32_t>(), counts.get<int32_t>());
    return KVC_CUDA_OK(cudaGetLastError());
  };
  auto gather = [&] { return kvc::gpu::KernelOk(b.Gather(ga, StreamHandle{}), "Gather"); };
  // Stages alone (each after the ones it needs have run once), then the whole pipeline.
  const int reps = o.reps;
  const double score_ms = kvc::gpu::BackendMedianMs(b, score, 1, reps);
  const double select_ms = score_ms > 0 ? kvc::gpu::BackendMedianMs(b, select, 1, reps) : -1;
  const double compact_ms = select_ms > 0 ? kvc::gpu::BackendMedianMs(b, compact, 1, reps) : -1;
  const double gather_ms = compact_ms > 0 ? kvc::gpu::BackendMedianMs(b, gather, 1, reps) : -1;
  const double total_ms =
      gather_ms > 0
          ? kvc::gpu::BackendMedianMs(
                b, [&] { return score() && select() && compact() && gather(); }, o.warmup, reps)
          : -1;
  if (total_ms <= 0) return false;
  // Self-check: every lane kept exactly sinks + recent + budget tokens (it has more).
  std::vector<int32_t> h_counts(lanes);
  if (!counts.Download(&h_counts, "counts")) return false;
  for (int lane = 0; lane < lanes; ++lane) {
    if (h_counts[lane] != kept) {
      std::fprintf(stderr, "snapkv: lane %d kept %d tokens, expected %d\n", lane, h_counts[lane],
                   kept);
      return false;
    }
  }
  // Baseline: one read of the sequence's KV records at copy bandwidth (a copy of bytes / 2
  // moves `bytes` of traffic, i.e. reads bytes / 2 and writes bytes / 2 in the copy's time).
  const double kv_bytes = static_cast<double>(lane_tokens) * 2.0 * l.record_bytes;
  arena.Reset(), dst_arena.Reset(), scores.Reset(), keep.Reset();
  KernelStatus st = KernelStatus::Ok();
  auto copy = bench::MakeCopyRun(b, kv_bytes, 1, &st);
  if (!kvc::gpu::KernelOk(st, "copy baseline")) return false;
  const double copy_ms = kvc::gpu::BackendMedianMs(
      b, [&] { return kvc::gpu::KernelOk(copy->Run(), "copy baseline"); }, o.warmup, reps);
  if (copy_ms <= 0) return false;
  r->name =
      std::string(o.quick ? "snapkv_llama8b_quick/" : "snapkv_llama8b_32k/") + StorageFormatName(f);
  r->bytes = kv_bytes;
  r->counted = "K+V records of every lane read once";
  r->op_ms = total_ms;
  r->baseline = "one read of the KV at D2D copy bandwidth";
  r->baseline_ms = copy_ms;
  r->ratio = total_ms / copy_ms;
  r->goal = 3.0;
  r->higher_is_better = false;
  r->extra = {{"score_ms", score_ms},   {"select_ms", select_ms}, {"compact_ms", compact_ms},
              {"gather_ms", gather_ms}, {"lanes", lanes},         {"tokens", tokens},
              {"kept_per_lane", kept},  {"group", group},         {"window", window}};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--reps" && i + 1 < argc) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--filter" && i + 1 < argc) {
      o.filter = argv[++i];
    } else if (arg == "--json" && i + 1 < argc) {
      o.json_path = argv[++i];
    } else if (arg == "--device" && i + 1 < argc) {
      o.device = std::atoi(argv[++i]);
    } else if (arg == "--backend" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "cpu" || std::string(argv[i + 1]) == "cuda")) {
      o.cpu = std::string(argv[++i]) == "cpu";
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--reps N] [--filter S] [--json FILE] [--device N] "
                   "[--backend cuda|cpu]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.quick && o.reps == 20) o.reps = 3;
  if (o.quick) o.warmup = 1;
  cudaDeviceProp prop{};
  std::string reason;
  if (o.cpu) {
    std::snprintf(prop.name, sizeof prop.name, "CPU backend (logic check, not GPU figures)");
  } else if (!kvc::gpu::ProbeDevice(o.device, &reason, &prop)) {
    return kvc::gpu::Skip(reason, o.json_path);
  }
  std::unique_ptr<KernelBackend> backend;
  BackendOptions bo;
  bo.device = o.device;
  const KernelStatus created =
      CreateBackend(o.cpu ? BackendKind::kCpu : BackendKind::kCuda, bo, &backend);
  if (!created.ok()) {
    if (o.cpu) return kvc::gpu::KernelOk(created, "CreateBackend(cpu)") ? 0 : 1;
    return kvc::gpu::Skip(created.detail, o.json_path);
  }
  std::printf("kvc_gpu_bench: %s (sm_%d%d, %d SMs, %.1f GiB), %s, median of %d after %d warm-up\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0, o.quick ? "quick" : "full", o.reps, o.warmup);

  std::vector<std::function<bool(Result*)>> cases;
  std::vector<std::string> names;
  const bench::BenchSize size = o.quick ? bench::BenchSize::kSmall : bench::BenchSize::kLarge;
  for (const bench::BenchCase& c : bench::AllCases(size)) {
    if (c.name.rfind("quantize/", 0) != 0 && c.name.rfind("dequantize/", 0) != 0) continue;
    names.push_back(c.name);
    cases.push_back([&, c](Result* r) {
      return TimeBenchCase(*backend, c, o, 0.8, "D2D copy of the same traffic", r);
    });
  }
  for (StorageFormat f : {StorageFormat::kInt4G32, StorageFormat::kF16}) {
    const bench::BenchCase c = bench::DecodeBatchCase(f, o.quick ? 2 : 16, o.quick ? 2048 : 8192);
    names.push_back(c.name);
    cases.push_back([&, c](Result* r) {
      return TimeBenchCase(*backend, c, o, 0.7, "memory roofline: KV bytes at D2D copy bandwidth",
                           r);
    });
    names.push_back(std::string("snapkv_llama8b/") + StorageFormatName(f));
    cases.push_back([&, f](Result* r) { return SnapKvPipeline(*backend, f, o, r); });
  }

  Json j;
  j.Open('{').Key("device").Str(prop.name).Key("sm").Num(prop.major * 10 + prop.minor);
  j.Key("quick").Bool(o.quick).Key("reps").Num(o.reps).Key("warmup").Num(o.warmup);
  j.Key("cases").Open('[');
  int errors = 0, missed = 0, ran = 0;
  std::printf("%-34s %10s %10s %10s %8s %6s\n", "case", "MB", "op ms", "base ms", "ratio", "goal");
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!o.filter.empty() && names[i].find(o.filter) == std::string::npos) continue;
    Result r;
    if (!cases[i](&r)) {
      std::printf("%-34s ERROR (see stderr)\n", names[i].c_str());
      j.Open('{').Key("name").Str(names[i]).Key("error").Bool(true).Close('}');
      ++errors;
      continue;
    }
    ++ran;
    if (!r.met()) ++missed;
    std::printf("%-34s %10.1f %10.4f %10.4f %8.3f %2s%4.2f %s\n", r.name.c_str(), r.bytes / 1e6,
                r.op_ms, r.baseline_ms, r.ratio, r.higher_is_better ? ">=" : "<=", r.goal,
                r.met() ? "met" : "GOAL MISSED");
    j.Open('{').Key("name").Str(r.name).Key("bytes").Num(r.bytes).Key("counted").Str(r.counted);
    j.Key("op_ms")
        .Num(r.op_ms)
        .Key("baseline")
        .Str(r.baseline)
        .Key("baseline_ms")
        .Num(r.baseline_ms);
    j.Key("op_gbps").Num(r.bytes / (r.op_ms * 1e-3) / 1e9);
    j.Key("ratio").Num(r.ratio).Key("goal").Str((r.higher_is_better ? ">= " : "<= ") +
                                                std::to_string(r.goal).substr(0, 4));
    j.Key("met").Bool(r.met());
    for (const auto& [k, v] : r.extra) j.Key(k).Num(v);
    j.Close('}');
  }
  j.Close(']').Key("ran").Num(ran).Key("errors").Num(errors).Key("goals_missed").Num(missed);
  j.Close('}');
  if (!j.WriteTo(o.json_path)) {
    std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
    ++errors;
  }
  std::printf("kvc_gpu_bench: %d cases ran, %d errors, %d goals missed\n", ran, errors, missed);
  return errors == 0 ? 0 : 1;
}
