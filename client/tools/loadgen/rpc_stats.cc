#include "client/tools/loadgen/rpc_stats.h"

#include <algorithm>
#include <utility>

namespace kvc::loadgen {
namespace {

RpcSummary SummaryOf(std::vector<float> ms, const std::map<std::string, int64_t>& codes) {
  RpcSummary s;
  s.latency = Summarize(&ms);
  s.codes = codes;
  return s;
}

}  // namespace

LatencySummary Summarize(std::vector<float>* ms) {
  LatencySummary s;
  s.count = static_cast<int64_t>(ms->size());
  if (ms->empty()) return s;
  std::sort(ms->begin(), ms->end());
  auto rank = [&](double q) {
    const auto i = static_cast<size_t>(q * static_cast<double>(ms->size() - 1) + 0.5);
    return static_cast<double>((*ms)[std::min(i, ms->size() - 1)]);
  };
  s.p50_ms = rank(0.50);
  s.p99_ms = rank(0.99);
  s.max_ms = static_cast<double>(ms->back());
  return s;
}

void RpcStats::Record(const std::string& rpc, absl::Duration latency, absl::StatusCode code) {
  const auto ms = static_cast<float>(absl::ToDoubleMilliseconds(latency));
  const std::string name = absl::StatusCodeToString(code);
  kvc::MutexLock lock(&mu_);
  for (auto* samples : {&total_[rpc], &window_[rpc]}) {
    samples->ms.push_back(ms);
    ++samples->codes[name];
  }
}

std::map<std::string, RpcSummary> RpcStats::Total() const {
  std::map<std::string, Samples> copy;
  {
    kvc::MutexLock lock(&mu_);
    copy = total_;
  }
  std::map<std::string, RpcSummary> out;
  for (auto& [rpc, samples] : copy) out[rpc] = SummaryOf(std::move(samples.ms), samples.codes);
  return out;
}

std::map<std::string, RpcSummary> RpcStats::TakeWindow() {
  std::map<std::string, Samples> window;
  {
    kvc::MutexLock lock(&mu_);
    window.swap(window_);
  }
  std::map<std::string, RpcSummary> out;
  for (auto& [rpc, samples] : window) out[rpc] = SummaryOf(std::move(samples.ms), samples.codes);
  return out;
}

}  // namespace kvc::loadgen
