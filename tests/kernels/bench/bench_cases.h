// Benchmark cases shared by the plain driver (kvc_kernels_bench, JSON output, no Google
// Benchmark needed) and the Google Benchmark driver (kvc_kernels_gbench). Each case owns
// its buffers in one backend's memory and reports the bytes one run moves, so that GB/s
// can sit beside a plain copy of the same bytes (memcpy, or device-to-device on CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvc/kernels/backend.h"

namespace kvc::kernels::bench {

class BenchRun {
 public:
  virtual ~BenchRun() = default;
  virtual KernelStatus Run() = 0;  // one op; CUDA runs are enqueued, not waited for
  virtual double Bytes() const = 0;
  virtual const char* Counted() const = 0;    // what Bytes() counts, for the report
  virtual double Flops() const { return 0; }  // compute-bound cases: useful flops of one run
};

struct BenchCase {
  std::string name;
  std::function<std::unique_ptr<BenchRun>(KernelBackend&, KernelStatus*)> make;
};

enum class BenchSize { kSmall, kLarge };  // small: CPU and smoke tests; large: GPU

std::vector<BenchCase> AllCases(BenchSize size);

// One decode step of one layer of a Llama-3-8B decode batch: `batch` sequences x 8 kv heads
// x `tokens` stored tokens, head_dim 128, GQA group 4. Not in AllCases: sized for a GPU
// (tests/gpu/gpu_bench.cu), too large for the CPU smoke runs.
BenchCase DecodeBatchCase(StorageFormat f, int batch, int tokens);

// The baseline: copies bytes / 2 so that its traffic (read + write) equals `bytes`.
// threads > 1 splits a host memcpy across std::threads (host backends only).
std::unique_ptr<BenchRun> MakeCopyRun(KernelBackend& backend, double bytes, int threads,
                                      KernelStatus* status);

}  // namespace kvc::kernels::bench
