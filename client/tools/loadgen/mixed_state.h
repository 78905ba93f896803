// What kvc-loadgen's mixed clients add up while they run; read by the report.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/tools/loadgen/rpc_stats.h"
#include "common/mutex.h"

namespace kvc::loadgen {

// RESOURCE_EXHAUSTED "pool 'P' is full: this request needs N F blocks (B bytes) but FREE of
// CAP bytes are free; ..." (host_block_pool.cc, the documented message), parsed.
struct PoolFullMessage {
  bool documented = false;
  int64_t needed_bytes = 0, free_bytes = 0, capacity_bytes = 0;
};
PoolFullMessage ParsePoolFull(const absl::Status& status);

struct MixedState {
  RpcStats rpcs;
  std::atomic<int64_t> sequences{0}, appended_tokens{0}, appended_bytes{0}, fetched_bytes{0};
  std::atomic<int64_t> fetches_checked{0}, rows_verified{0}, wrong_bytes{0}, bad_fetches{0};
  std::atomic<int64_t> missing_rows{0}, compressions{0}, attends{0};
  std::atomic<int64_t> resource_exhausted{0}, re_documented{0}, re_pool_full{0};
  std::atomic<int64_t> unexpected{0};
  std::atomic<int64_t> clients_lost{0}, first_loss_unix_ms{0}, last_return_unix_ms{0};

  void Note(std::vector<std::string>* list, std::string what) {
    kvc::MutexLock lock(&mu);
    if (list->size() < 10) list->push_back(std::move(what));
  }
  kvc::Mutex mu;
  std::vector<std::string> problems ABSL_GUARDED_BY(mu);  // wrong fetches
  std::vector<std::string> unexpected_examples ABSL_GUARDED_BY(mu);
  std::vector<std::string> re_examples ABSL_GUARDED_BY(mu);
  // Pool used/capacity from a GetPoolStats right after each RESOURCE_EXHAUSTED.
  std::vector<double> re_used_fraction ABSL_GUARDED_BY(mu);
  // The free bytes each pool-full message reported.
  std::vector<int64_t> re_free_bytes ABSL_GUARDED_BY(mu);
};

}  // namespace kvc::loadgen
