// Samples a process's resident memory (VmRSS of /proc/PID/status) on a thread of its own:
// kvcached exports no process-memory metric, so kvc-loadgen reads it when it runs on the
// server's host (--server_pid).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/mutex.h"

namespace kvc::loadgen {

// VmRSS of `pid` in KiB; -1 when the process is gone or unreadable.
int64_t ReadRssKib(int pid);

class RssSampler {
 public:
  struct Sample {
    double t_s = 0;  // since the sampler started
    int64_t kib = 0;
  };
  // Starts sampling every `interval`; pid <= 0 samples nothing.
  RssSampler(int pid, absl::Duration interval);
  RssSampler(const RssSampler&) = delete;
  RssSampler& operator=(const RssSampler&) = delete;
  ~RssSampler();  // stops and joins the thread

  std::vector<Sample> Samples() const;
  int64_t Latest() const;  // -1 before the first sample or without a pid

 private:
  void Loop(int pid, absl::Duration interval, absl::Time start);

  mutable kvc::Mutex mu_;
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvc::loadgen
