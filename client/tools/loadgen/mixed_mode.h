// kvc-loadgen --mode=mixed: N concurrent clients, each looping CreateSequence, a streamed
// Append of a random size, Fetch (dense, sometimes stored), sometimes Compress (StreamingLLM
// or SnapKV) or Attend, and Release, for a fixed duration. Every fetched byte is checked
// (kv_check.h); latencies, status codes, RESOURCE_EXHAUSTED with the pool state behind it,
// the server's RSS and the pool's return to its baseline are reported.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "kvc/client/kv_cache_client.h"

namespace kvc::loadgen {

struct MixedOptions {
  std::string tenant;
  int clients = 64;
  absl::Duration duration = absl::Seconds(60);
  int min_tokens = 64;  // sequence lengths are log-uniform in [min_tokens, max_tokens]
  int max_tokens = 8192;
  int chunk_tokens = 512;  // tokens per AppendStream message
  int server_pid = 0;      // > 0: sample its VmRSS (kvcached on this host)
  absl::Duration report_interval = absl::ZeroDuration();  // > 0: a line per interval
  std::string json_path;
  // The test kills the server during the run: UNAVAILABLE / DEADLINE_EXCEEDED end a client
  // (its return time is reported) instead of counting as unexpected.
  bool expect_server_loss = false;
  absl::Duration settle = absl::Seconds(30);  // wait for the pool to return to its baseline
  uint64_t seed = 1;
};

// Runs the load against `pool` and prints the report. 0 = every byte right, no unexpected
// status, pool back to baseline; 3 otherwise.
int RunMixed(client::KvCacheClient& client, const client::PoolInfo& pool,
             const MixedOptions& options);

}  // namespace kvc::loadgen
