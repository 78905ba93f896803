#include "client/tools/loadgen/mixed_mode.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/tools/loadgen/mixed_client.h"
#include "client/tools/loadgen/mixed_report.h"
#include "client/tools/loadgen/mixed_state.h"
#include "client/tools/loadgen/rss_sampler.h"
#include "kvc/client/admin_client.h"

namespace kvc::loadgen {

PoolFullMessage ParsePoolFull(const absl::Status& status) {
  PoolFullMessage m;
  const std::string text(status.message());
  static constexpr char kFull[] = "' is full: this request needs ";
  const size_t at = text.find(kFull);
  if (status.code() != absl::StatusCode::kResourceExhausted || at == std::string::npos ||
      text.rfind("pool '", at) == std::string::npos) {
    return m;
  }
  long long blocks = 0, needed = 0, free_bytes = 0, capacity = 0;
  char format[32] = {};
  // NOLINTNEXTLINE(cert-err34-c): sscanf's count says whether every field was read.
  if (std::sscanf(text.c_str() + at + sizeof(kFull) - 1,
                  "%lld %31s blocks (%lld bytes) but %lld of %lld bytes are free", &blocks, format,
                  &needed, &free_bytes, &capacity) != 5) {
    return m;
  }
  m.documented = text.find(
                     "release sequences, compress them, or give the pool more "
                     "capacity_bytes") != std::string::npos;
  m.needed_bytes = needed;
  m.free_bytes = free_bytes;
  m.capacity_bytes = capacity;
  return m;
}

namespace {

// Polls the pool until it holds what it held before the load, or `settle` passes.
PoolEnd WaitForBaseline(client::KvCacheClient& client, const client::PoolInfo& pool,
                        const client::PoolStats& baseline, absl::Duration settle) {
  PoolEnd end;
  end.capacity_bytes = baseline.capacity_bytes;
  end.baseline_used_bytes = baseline.used_bytes;
  end.baseline_sequences = baseline.sequences;
  const absl::Time start = absl::Now();
  do {
    auto stats = kvc::client::AdminClient::Over(client).GetPoolStats(pool.name);
    if (stats.ok()) {
      end.end_used_bytes = stats->used_bytes;
      end.end_sequences = stats->sequences;
      if (stats->used_bytes == baseline.used_bytes && stats->sequences == baseline.sequences) {
        end.back_to_baseline = true;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() - start < settle);
  end.settle_s = absl::ToDoubleSeconds(absl::Now() - start);
  return end;
}

void PrintWindow(const WindowReport& w) {
  std::printf("[%6.0f s] rss %lld KiB, pool %.0f%% used", w.t_s, static_cast<long long>(w.rss_kib),
              100 * w.pool_used_fraction);
  for (const auto& [rpc, s] : w.rpcs) {
    std::printf(", %s %lld p99 %.1f ms", rpc.c_str(), static_cast<long long>(s.latency.count),
                s.latency.p99_ms);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int RunMixed(client::KvCacheClient& client, const client::PoolInfo& pool,
             const MixedOptions& options) {
  auto baseline = kvc::client::AdminClient::Over(client).GetPoolStats(pool.name);
  if (!baseline.ok()) {
    std::fprintf(stderr, "kvc-loadgen: GetPoolStats: %s\n", baseline.status().ToString().c_str());
    return 2;
  }
  std::printf(
      "kvc-loadgen mixed: pool '%s' (%d layers x %d kv heads x head_dim %d, %s, %lld "
      "bytes), %d clients sharing one client channel, %d..%d tokens per sequence\n",
      pool.name.c_str(), pool.geometry.num_layers, pool.geometry.num_kv_heads,
      pool.geometry.head_dim, client::DTypeName(pool.geometry.dtype),
      static_cast<long long>(pool.capacity_bytes), options.clients, options.min_tokens,
      options.max_tokens);
  std::fflush(stdout);
  MixedState state;
  MixedReport report;
  report.clients = options.clients;
  report.expect_server_loss = options.expect_server_loss;
  auto rss = std::make_unique<RssSampler>(options.server_pid, absl::Seconds(1));
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options.duration;
  std::atomic<int> running{options.clients};
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(options.clients));
  for (int i = 0; i < options.clients; ++i) {
    threads.emplace_back([&, i] {
      MixedClient(i, &client, &pool, &options, &state).Run(deadline);
      --running;
    });
  }
  // Windows: RSS, pool usage and p99 per interval while the clients run.
  if (options.report_interval > absl::ZeroDuration()) {
    absl::Time next = start + options.report_interval;
    while (running > 0) {
      absl::SleepFor(absl::Milliseconds(100));
      if (absl::Now() < next) continue;
      next += options.report_interval;
      WindowReport w;
      w.t_s = absl::ToDoubleSeconds(absl::Now() - start);
      w.rss_kib = rss->Latest();
      auto stats = kvc::client::AdminClient::Over(client).GetPoolStats(pool.name);
      if (stats.ok() && stats->capacity_bytes > 0) {
        w.pool_used_fraction =
            static_cast<double>(stats->used_bytes) / static_cast<double>(stats->capacity_bytes);
      }
      w.rpcs = state.rpcs.TakeWindow();
      PrintWindow(w);
      report.windows.push_back(std::move(w));
    }
  }
  for (auto& t : threads) t.join();
  const absl::Time stopped = absl::Now();
  // Clients finish the sequence they hold at the deadline: the load lasts until the last.
  report.duration_s = absl::ToDoubleSeconds(stopped - start);
  if (!options.expect_server_loss) {
    report.pool = WaitForBaseline(client, pool, *baseline, options.settle);
  }
  report.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  report.rpcs = state.rpcs.Total();
  report.rss = rss->Samples();  // the last ones taken while the pool settled
  rss.reset();
  report.failed = state.wrong_bytes > 0 || state.bad_fetches > 0 || state.unexpected > 0 ||
                  (!options.expect_server_loss && !report.pool.back_to_baseline);
  PrintReport(report, state);
  if (!options.json_path.empty() && !WriteJson(options.json_path, report, state)) {
    std::fprintf(stderr, "kvc-loadgen: cannot write %s\n", options.json_path.c_str());
    return 2;
  }
  return report.failed ? 3 : 0;
}

}  // namespace kvc::loadgen
