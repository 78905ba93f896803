// Latencies and status codes of every call kvc-loadgen makes, per RPC: over the whole run
// and over the current reporting window (a soak prints p99 per minute to show it is flat).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace kvc::loadgen {

struct LatencySummary {
  int64_t count = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

// Sorts `ms` and summarizes it (nearest-rank percentiles).
LatencySummary Summarize(std::vector<float>* ms);

struct RpcSummary {
  LatencySummary latency;
  std::map<std::string, int64_t> codes;  // status code name -> calls, OK included
};

class RpcStats {
 public:
  void Record(const std::string& rpc, absl::Duration latency, absl::StatusCode code);
  // The whole run, per RPC.
  std::map<std::string, RpcSummary> Total() const;
  // Since the previous call, per RPC; starts a new window.
  std::map<std::string, RpcSummary> TakeWindow();

 private:
  struct Samples {
    std::vector<float> ms;
    std::map<std::string, int64_t> codes;
  };
  mutable kvc::Mutex mu_;
  std::map<std::string, Samples> total_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Samples> window_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::loadgen
