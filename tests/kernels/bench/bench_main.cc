// Plain benchmark driver (no Google Benchmark needed): times every case and a copy of the
// same bytes in the same run, prints a table and optionally JSON.
//   kvc_kernels_bench [--backend cpu|cuda] [--threads N] [--large] [--quick]
//                     [--filter S] [--json FILE]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "bench_cases.h"

using namespace kvc::kernels;

namespace {

// Seconds per run: warm-up, then repeat until min_seconds (at least 3 runs).
double TimeRuns(KernelBackend& b, bench::BenchRun& run, double min_seconds, KernelStatus* st) {
  *st = run.Run();
  if (st->ok()) *st = b.Synchronize(StreamHandle{});
  if (!st->ok()) return 0;
  int iters = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  int batch = 1;
  while (elapsed < min_seconds || iters < 3) {
    for (int i = 0; i < batch && st->ok(); ++i) *st = run.Run();
    if (st->ok()) *st = b.Synchronize(StreamHandle{});
    if (!st->ok()) return 0;
    iters += batch;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed < min_seconds / 10) batch *= 2;
  }
  return elapsed / iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_name = "cpu", filter, json_path;
  int threads = 2;
  bool large = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc)
      backend_name = argv[++i];
    else if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--large")
      large = true;
    else if (a == "--quick")
      quick = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--backend cpu|cuda] [--threads N] [--large] [--quick] [--filter S] "
                   "[--json F]\n",
                   argv[0]);
      return 2;
    }
  }
  const BackendKind kind = backend_name == "cuda" ? BackendKind::kCuda : BackendKind::kCpu;
  std::unique_ptr<KernelBackend> backend;
  BackendOptions options;
  options.num_threads = threads;
  const KernelStatus created = CreateBackend(kind, options, &backend);
  if (!created.ok()) {
    std::printf("SKIP: %s backend unavailable: %s\n", backend_name.c_str(), created.detail);
    if (!json_path.empty())
      std::ofstream(json_path) << "{\"skipped\": \"" << created.detail << "\"}\n";
    return 0;
  }
  const double min_seconds = quick ? 0.02 : 0.3;
  const bool host = kind != BackendKind::kCuda;
  std::printf("backend %s, %s threads, %s geometry\n", backend->name(),
              host ? std::to_string(threads).c_str() : "-", large ? "large" : "small");
  std::printf("%-22s %10s %10s %10s %8s %10s %8s\n", "case", "MB/run", "op GB/s", "copy GB/s",
              "ratio", host ? "copyNt GB/s" : "", host ? "ratioNt" : "");
  std::string json = "{\"backend\": \"" + std::string(backend->name()) +
                     "\", \"threads\": " + std::to_string(threads) + ", \"cases\": [\n";
  bool first = true;
  int failures = 0;
  for (const auto& c :
       bench::AllCases(large ? bench::BenchSize::kLarge : bench::BenchSize::kSmall)) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    KernelStatus st = KernelStatus::Ok();
    double op_s = 0, copy_s = 0, copy_nt_s = 0, bytes = 0, flops = 0;
    {
      auto run = c.make(*backend, &st);
      if (st.ok()) {
        bytes = run->Bytes();
        flops = run->Flops();
        op_s = TimeRuns(*backend, *run, min_seconds, &st);
      }
    }
    if (st.ok()) {
      auto copy = bench::MakeCopyRun(*backend, bytes, 1, &st);
      if (st.ok()) copy_s = TimeRuns(*backend, *copy, min_seconds, &st);
    }
    if (st.ok() && host && threads > 1) {
      auto copy = bench::MakeCopyRun(*backend, bytes, threads, &st);
      if (st.ok()) copy_nt_s = TimeRuns(*backend, *copy, min_seconds, &st);
    }
    if (!st.ok()) {
      std::printf("%-22s FAILED: %s %s\n", c.name.c_str(), KernelStatusCodeName(st.code),
                  st.detail);
      ++failures;
      continue;
    }
    const double op = bytes / op_s / 1e9, copy = bytes / copy_s / 1e9;
    const double copy_nt = copy_nt_s > 0 ? bytes / copy_nt_s / 1e9 : 0;
    std::printf("%-22s %10.1f %10.2f %10.2f %8.2f", c.name.c_str(), bytes / 1e6, op, copy,
                op / copy);
    if (copy_nt > 0) std::printf(" %10.2f %8.2f", copy_nt, op / copy_nt);
    if (flops > 0)
      std::printf("  %.1f GFLOP/s, %.4f s/run", flops / op_s / 1e9, op_s);
    else
      std::printf("  %.0f us/run", op_s * 1e6);
    std::printf("\n");
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s  {\"name\": \"%s\", \"bytes\": %.0f, \"op_seconds\": %.6g, \"op_gbps\": "
                  "%.4g, \"copy_gbps\": %.4g, "
                  "\"ratio\": %.4g, \"copy_threads_gbps\": %.4g, \"gflops\": %.4g}",
                  first ? "" : ",\n", c.name.c_str(), bytes, op_s, op, copy, op / copy, copy_nt,
                  flops / op_s / 1e9);
    json += buf;
    first = false;
  }
  json += "\n]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return failures == 0 ? 0 : 1;
}
