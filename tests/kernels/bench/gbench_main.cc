// Google Benchmark driver over the same cases: each case registered for the CPU backend (2
// threads) and, when a device is present, CUDA, each beside a copy of the same bytes.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "bench_cases.h"

using namespace kvc::kernels;

namespace {

std::vector<std::unique_ptr<KernelBackend>>& Backends() {
  static std::vector<std::unique_ptr<KernelBackend>> backends;
  return backends;
}

void RunCase(benchmark::State& state, KernelBackend* b, const bench::BenchCase* c, bool copy) {
  KernelStatus st = KernelStatus::Ok();
  std::unique_ptr<bench::BenchRun> run = c->make(*b, &st);
  if (st.ok() && copy) run = bench::MakeCopyRun(*b, run->Bytes(), 1, &st);
  if (!st.ok()) {
    state.SkipWithError(st.detail);
    return;
  }
  for (auto _ : state) {
    st = run->Run();
    if (st.ok()) st = b->Synchronize(StreamHandle{});
    if (!st.ok()) {
      state.SkipWithError(st.detail);
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * run->Bytes()));
  if (run->Flops() > 0) {
    state.counters["FLOPS"] = benchmark::Counter(
        static_cast<double>(state.iterations()) * run->Flops(), benchmark::Counter::kIsRate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  static std::vector<bench::BenchCase> small = bench::AllCases(bench::BenchSize::kSmall);
  static std::vector<bench::BenchCase> large = bench::AllCases(bench::BenchSize::kLarge);
  BackendOptions cpu_options;
  cpu_options.num_threads = 2;
  std::unique_ptr<KernelBackend> b;
  if (CreateBackend(BackendKind::kCpu, cpu_options, &b).ok()) Backends().push_back(std::move(b));
  if (CreateBackend(BackendKind::kCuda, BackendOptions{}, &b).ok())
    Backends().push_back(std::move(b));
  for (auto& backend : Backends()) {
    const bool cuda = backend->kind() == BackendKind::kCuda;
    for (const auto& c : cuda ? large : small) {
      for (bool copy : {false, true}) {
        const std::string name =
            std::string(backend->name()) + "/" + c.name + (copy ? "/copy_same_bytes" : "");
        benchmark::RegisterBenchmark(name.c_str(), RunCase, backend.get(), &c, copy)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
