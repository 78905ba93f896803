// The end-of-run report of kvc-loadgen's mixed mode: printed as a table and written as JSON
// (--json) for tests and for the documentation's figures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "client/tools/loadgen/mixed_state.h"
#include "client/tools/loadgen/rpc_stats.h"
#include "client/tools/loadgen/rss_sampler.h"

namespace kvc::loadgen {

// One reporting window (--report_interval): how the soak shows flat RSS and latency.
struct WindowReport {
  double t_s = 0;
  int64_t rss_kib = -1;
  double pool_used_fraction = -1;
  std::map<std::string, RpcSummary> rpcs;
};

struct PoolEnd {
  int64_t capacity_bytes = 0;
  int64_t baseline_used_bytes = 0, baseline_sequences = 0;
  int64_t end_used_bytes = -1, end_sequences = -1;
  bool back_to_baseline = false;
  double settle_s = 0;  // from the end of the load until the pool was back
};

struct MixedReport {
  int clients = 0;
  double duration_s = 0, wall_s = 0;
  bool expect_server_loss = false;
  std::map<std::string, RpcSummary> rpcs;
  std::vector<WindowReport> windows;
  std::vector<RssSampler::Sample> rss;
  PoolEnd pool;
  bool failed = false;
};

void PrintReport(const MixedReport& report, MixedState& state);
// False when the file cannot be written.
bool WriteJson(const std::string& path, const MixedReport& report, MixedState& state);

}  // namespace kvc::loadgen
