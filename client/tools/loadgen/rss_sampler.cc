#include "client/tools/loadgen/rss_sampler.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvc::loadgen {

int64_t ReadRssKib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

RssSampler::RssSampler(int pid, absl::Duration interval) {
  if (pid > 0) thread_ = std::thread([this, pid, interval] { Loop(pid, interval, absl::Now()); });
}

RssSampler::~RssSampler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void RssSampler::Loop(int pid, absl::Duration interval, absl::Time start) {
  absl::Time next = start;
  while (!stop_) {
    if (absl::Now() >= next) {
      const int64_t kib = ReadRssKib(pid);
      if (kib < 0) return;  // the server is gone
      kvc::MutexLock lock(&mu_);
      samples_.push_back({absl::ToDoubleSeconds(absl::Now() - start), kib});
      next += interval;
    }
    // Short sleeps so the destructor never waits a whole interval.
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::vector<RssSampler::Sample> RssSampler::Samples() const {
  kvc::MutexLock lock(&mu_);
  return samples_;
}

int64_t RssSampler::Latest() const {
  kvc::MutexLock lock(&mu_);
  return samples_.empty() ? -1 : samples_.back().kib;
}

}  // namespace kvc::loadgen
