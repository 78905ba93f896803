// kvc-loadgen: drives a KV workload through kvcached with the client library.
// --mode=prefill (default), the way an engine does during prefill: create sequences, stream
// every layer's keys/values in, fetch them back, check every byte, report throughput and
// pool usage, release. --mode=mixed: many concurrent clients looping over whole sequence
// lifetimes for a fixed time (client/tools/loadgen/mixed_mode.h).
//
//   kvc-loadgen --target=127.0.0.1:50051 --sequences=8 --tokens=4096
//   kvc-loadgen --mode=mixed --clients=64 --duration=60s --server_pid=$(pidof kvcached)
//   kvc-loadgen --target=kvc.example:50051 --tls_ca=ca.pem --token_file=token  (TLS + token)
//   kvc-loadgen --targets=10.0.0.1:50051,10.0.0.2:50051 --sequences=24   (a cluster: prefill
//     through ClusterClient; figures per shard too. Or --dns=kvcached.ns.svc:50051)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/security_flags.h"
#include "client/tools/loadgen/dense_check.h"
#include "client/tools/loadgen/mixed_mode.h"
#include "common/mutex.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/cluster_client.h"
#include "kvc/client/kv_cache_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "kvcached address");
ABSL_FLAG(std::string, targets, "",
          "a cluster: comma-separated kvcached shard addresses (instead of --target; prefill)");
ABSL_FLAG(std::string, dns, "",
          "a cluster: host:port whose every DNS address is a shard (instead of --target)");
ABSL_FLAG(int32_t, min_shards, 0,
          "--targets/--dns: wait (up to --deadline) until this many shards serve (0 = every "
          "--targets address, 1 with --dns)");
ABSL_FLAG(std::string, pool, "", "pool to use (default: the server's first pool)");
ABSL_FLAG(int32_t, sequences, 8, "sequences to create");
ABSL_FLAG(int32_t, tokens, 4096, "prompt tokens per sequence");
ABSL_FLAG(int32_t, chunk_tokens, 512, "tokens per Append message");
ABSL_FLAG(int32_t, threads, 2, "concurrent client threads");
ABSL_FLAG(int32_t, keep, 0, "leave this many sequences in the pool (for kvcachectl)");
ABSL_FLAG(std::string, mode, "prefill", "prefill or mixed");
ABSL_FLAG(absl::Duration, deadline, absl::Seconds(30), "deadline of each call");
ABSL_FLAG(bool, local_reads, true,
          "on kvcached's node, fetch from the mapped pool and append through a staging region "
          "(when its config has local_socket); false: every byte over gRPC");
// --mode=mixed
ABSL_FLAG(int32_t, clients, 64, "mixed: concurrent clients (threads sharing one client)");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(60), "mixed: how long to run");
ABSL_FLAG(int32_t, min_tokens, 64, "mixed: shortest sequence (lengths are log-uniform)");
ABSL_FLAG(int32_t, max_tokens, 8192, "mixed: longest sequence");
ABSL_FLAG(int32_t, server_pid, 0, "mixed: kvcached's pid on this host, to sample its VmRSS");
ABSL_FLAG(absl::Duration, report_interval, absl::ZeroDuration(),
          "mixed: print RSS, pool usage and p99 per RPC every interval (0 = only at the end)");
ABSL_FLAG(std::string, json, "", "mixed: also write the report as JSON to this file");
ABSL_FLAG(bool, expect_server_loss, false,
          "mixed: the server is killed during the run; UNAVAILABLE or DEADLINE_EXCEEDED stop a "
          "client instead of failing the run");
ABSL_FLAG(absl::Duration, settle, absl::Seconds(30),
          "mixed: how long to wait for the pool to return to its baseline");
ABSL_FLAG(uint64_t, seed, 1, "mixed: seed of the sequence lengths and operations");
ABSL_FLAG(std::string, tenant, "",
          "tenant label of the sequences; default 'loadgen' without credentials (with a token "
          "or client certificate the server takes the tenant from them)");

namespace {

using kvc::client::AppendChunk;
using kvc::client::KvCacheClient;

std::string Human(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

// One shard's part of a --targets/--dns run.
struct ShardTotals {
  int sequences = 0;
  int64_t bytes = 0, tokens = 0;  // bytes appended (= fetched)
  double append_seconds = 0, fetch_seconds = 0;
};

// What the worker threads add up.
struct Totals {
  std::map<std::string, ShardTotals> shards;  // by shard name (--targets/--dns)
  int64_t bytes_in = 0, bytes_out = 0, tokens = 0;
  double append_seconds = 0, fetch_seconds = 0;
  std::vector<std::string> kept;
  std::string error;
};

// Totals shared by the worker threads; read once every worker has joined.
struct SharedTotals {
  kvc::Mutex mu;
  Totals totals ABSL_GUARDED_BY(mu);
};

// Payload of one layer of one sequence: pseudo-random f16 of moderate magnitude.
std::string LayerPayload(uint64_t seed, size_t bytes) {
  std::string out(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const uint16_t h = static_cast<uint16_t>(0x3000 + (rng() % 0x1000)) | ((rng() & 1) << 15);
    out[i] = static_cast<char>(h & 0xff);
    out[i + 1] = static_cast<char>(h >> 8);
  }
  return out;
}

// --pool, or the server's first pool.
const kvc::client::PoolInfo* ChoosePool(const std::vector<kvc::client::PoolInfo>& pools) {
  const std::string pool_name = absl::GetFlag(FLAGS_pool);
  const kvc::client::PoolInfo* pool = &pools.front();
  for (const auto& p : pools) {
    if (p.name == pool_name) pool = &p;
  }
  return pool;
}

std::unique_ptr<kvc::client::AppendStream> StartStream(KvCacheClient& client, const std::string&) {
  return client.StartAppendStream();
}
std::unique_ptr<kvc::client::AppendStream> StartStream(kvc::client::ClusterClient& client,
                                                       const std::string& sequence_id) {
  return client.StartAppendStream(sequence_id);
}

// The prefill run through `client` (a KvCacheClient, or a ClusterClient: then the figures
// are also given per shard, the shard being the one each sequence id names). pool_now prints
// the pool's state at the end.
template <typename Client>
int RunPrefill(Client& client, const kvc::client::PoolInfo* pool,
               const kvc::client::ClientOptions& options, bool per_shard,
               const std::vector<std::string>& shard_names, const std::function<void()>& pool_now) {
  const auto& g = pool->geometry;
  const int dtype_bytes = kvc::client::DTypeBytes(g.dtype);
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const int chunk = std::max(1, absl::GetFlag(FLAGS_chunk_tokens));
  const int sequences = absl::GetFlag(FLAGS_sequences);
  const int keep = std::min(absl::GetFlag(FLAGS_keep), sequences);
  std::string tenant = absl::GetFlag(FLAGS_tenant);
  if (tenant.empty() && options.bearer_token.empty() && options.tls.cert_file.empty()) {
    tenant = "loadgen";
  }
  const size_t token_layer_bytes = static_cast<size_t>(g.num_kv_heads) * g.head_dim * dtype_bytes;
  std::printf(
      "kvc-loadgen: pool '%s' (%d layers x %d kv heads x head_dim %d, %s), %d sequences x "
      "%d tokens, %d threads\n",
      pool->name.c_str(), g.num_layers, g.num_kv_heads, g.head_dim, kvc::client::DTypeName(g.dtype),
      sequences, tokens, absl::GetFlag(FLAGS_threads));

  SharedTotals shared;
  {
    kvc::MutexLock lock(&shared.mu);
    for (const std::string& name : shard_names) shared.totals.shards[name];  // also those given 0
  }
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int s = next.fetch_add(1); s < sequences; s = next.fetch_add(1)) {
      auto fail = [&](const std::string& what, const absl::Status& status) {
        kvc::MutexLock lock(&shared.mu);
        if (shared.totals.error.empty()) shared.totals.error = what + ": " + status.ToString();
      };
      auto seq = client.CreateSequence({pool->name, tenant, "", {}, {}});
      if (!seq.ok()) return fail("CreateSequence", seq.status());
      std::vector<std::string> keys(static_cast<size_t>(g.num_layers));
      std::vector<std::string> values(static_cast<size_t>(g.num_layers));
      for (int l = 0; l < g.num_layers; ++l) {
        keys[static_cast<size_t>(l)] =
            LayerPayload(uint64_t(s) << 20 | uint64_t(l) << 1, tokens * token_layer_bytes);
        values[static_cast<size_t>(l)] =
            LayerPayload(uint64_t(s) << 20 | uint64_t(l) << 1 | 1, tokens * token_layer_bytes);
      }
      // Prefill: chunks in position order, every layer of a chunk before the next chunk,
      // as an engine produces them.
      const absl::Time t0 = absl::Now();
      auto stream = StartStream(client, seq->sequence_id);
      for (int start = 0; start < tokens; start += chunk) {
        const int n = std::min(chunk, tokens - start);
        for (int l = 0; l < g.num_layers; ++l) {
          AppendChunk c;
          c.sequence_id = seq->sequence_id;
          c.layer = l;
          c.start_position = start;
          c.num_tokens = n;
          c.dtype = g.dtype;
          c.keys = keys[static_cast<size_t>(l)].data() + start * token_layer_bytes;
          c.values = values[static_cast<size_t>(l)].data() + start * token_layer_bytes;
          c.bytes = n * token_layer_bytes;
          if (!stream->Write(c).ok()) break;
        }
      }
      auto appended = stream->Finish();
      if (!appended.ok()) return fail("AppendStream", appended.status());
      const absl::Time t1 = absl::Now();
      auto kv = client.Fetch(seq->sequence_id, {});
      if (!kv.ok()) return fail("Fetch", kv.status());
      const absl::Time t2 = absl::Now();
      // Fetch returns [tokens, head_dim] per head; the input was [tokens, heads, head_dim].
      kvc::loadgen::AppendedKv sent;
      sent.keys = &keys;
      sent.values = &values;
      sent.num_heads = g.num_kv_heads;
      sent.head_bytes = static_cast<size_t>(g.head_dim) * dtype_bytes;
      sent.tokens = tokens;
      if (absl::Status checked = kvc::loadgen::CheckDense(*kv, sent); !checked.ok()) {
        return fail(absl::StrFormat("verify sequence %s", seq->sequence_id), checked);
      }
      const int64_t bytes =
          2 * int64_t{tokens} * g.num_layers * static_cast<int64_t>(token_layer_bytes);
      {
        kvc::MutexLock lock(&shared.mu);
        shared.totals.bytes_in += bytes;
        shared.totals.bytes_out += bytes;
        shared.totals.tokens += tokens;
        shared.totals.append_seconds += absl::ToDoubleSeconds(t1 - t0);
        shared.totals.fetch_seconds += absl::ToDoubleSeconds(t2 - t1);
        if (per_shard) {
          auto shard = kvc::client::ClusterClient::ShardOf(seq->sequence_id);
          ShardTotals& st = shared.totals.shards[shard.ok() ? *shard : "?"];
          ++st.sequences;
          st.bytes += bytes;
          st.tokens += tokens;
          st.append_seconds += absl::ToDoubleSeconds(t1 - t0);
          st.fetch_seconds += absl::ToDoubleSeconds(t2 - t1);
        }
        if (static_cast<int>(shared.totals.kept.size()) < keep) {
          shared.totals.kept.push_back(seq->sequence_id);
          continue;
        }
      }
      auto released = client.Release(seq->sequence_id);
      if (!released.ok()) return fail("Release", released.status());
    }
  };
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_threads)); ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  Totals totals;
  {
    kvc::MutexLock lock(&shared.mu);
    totals = std::move(shared.totals);
  }
  if (!totals.error.empty()) {
    std::fprintf(stderr, "kvc-loadgen: FAILED: %s\n", totals.error.c_str());
    return 3;
  }
  std::printf(
      "  sequences        %d created, every byte fetched back and verified, %d released, %zu "
      "kept\n",
      sequences, sequences - static_cast<int>(totals.kept.size()), totals.kept.size());
  std::printf("  tokens           %lld prompt tokens x %d layers\n",
              static_cast<long long>(totals.tokens), g.num_layers);
  std::printf("  appended         %s in %.2f s of stream time (%.2f GB/s per stream)\n",
              Human(static_cast<double>(totals.bytes_in)).c_str(), totals.append_seconds,
              static_cast<double>(totals.bytes_in) / totals.append_seconds / 1e9);
  std::printf("  fetched          %s in %.2f s of stream time (%.2f GB/s per stream)\n",
              Human(static_cast<double>(totals.bytes_out)).c_str(), totals.fetch_seconds,
              static_cast<double>(totals.bytes_out) / totals.fetch_seconds / 1e9);
  std::printf("  wall             %.2f s, %.0f tokens/s end to end\n", wall,
              static_cast<double>(totals.tokens) / wall);
  if constexpr (std::is_same_v<Client, KvCacheClient>) {
    // Fetch reads a host pool through shared memory when kvcached is on this node, and
    // appends go through a staging region.
    std::printf("  fetch path       %s\n", client.DataPath().c_str());
    std::printf("  append path      %s\n", client.AppendPath().c_str());
  }
  for (const auto& [shard, st] : totals.shards) {
    if (st.sequences == 0) {
      std::printf("  shard %-10s 0 sequences\n", shard.c_str());
      continue;
    }
    std::printf(
        "  shard %-10s %d sequences, %s appended (%.2f GB/s per stream), fetched (%.2f GB/s per "
        "stream), %.0f tokens/s of the wall time\n",
        shard.c_str(), st.sequences, Human(static_cast<double>(st.bytes)).c_str(),
        static_cast<double>(st.bytes) / st.append_seconds / 1e9,
        static_cast<double>(st.bytes) / st.fetch_seconds / 1e9,
        static_cast<double>(st.tokens) / wall);
  }
  pool_now();
  for (const auto& id : totals.kept) std::printf("  kept             %s\n", id.c_str());
  return 0;
}

// --targets / --dns: the prefill run through a ClusterClient.
int RunCluster(const kvc::client::ClientOptions& client_options) {
  kvc::client::ClusterOptions options;
  const std::string targets = absl::GetFlag(FLAGS_targets);
  if (!targets.empty()) options.targets = absl::StrSplit(targets, ',', absl::SkipWhitespace());
  options.dns_name = absl::GetFlag(FLAGS_dns);
  options.client = client_options;
  auto cluster_or = kvc::client::ClusterClient::Connect(options);
  if (!cluster_or.ok()) {
    std::fprintf(stderr, "kvc-loadgen: %s\n", cluster_or.status().ToString().c_str());
    return 1;
  }
  kvc::client::ClusterClient& cluster = **cluster_or;
  int min_shards = absl::GetFlag(FLAGS_min_shards);
  if (min_shards <= 0) min_shards = options.targets.empty() ? 1 : int(options.targets.size());
  if (absl::Status status = cluster.WaitForShards(min_shards, absl::GetFlag(FLAGS_deadline));
      !status.ok()) {
    std::fprintf(stderr, "kvc-loadgen: fewer than %d shards serve: %s\n", min_shards,
                 status.ToString().c_str());
    return 2;
  }
  // The pools of the first serving shard (a cluster's shards share their pool layout).
  absl::StatusOr<std::vector<kvc::client::PoolInfo>> pools =
      absl::UnavailableError("no serving shard");
  for (const auto& s : cluster.Shards()) {
    if (s.state != kvc::client::ShardState::kServing) continue;
    auto endpoint = cluster.EndpointClient(s.address);
    if (!endpoint.ok()) continue;
    pools = kvc::client::AdminClient::Over(**endpoint).ListPools();
    if (pools.ok()) break;
  }
  if (!pools.ok() || pools->empty()) {
    std::fprintf(stderr, "kvc-loadgen: cannot list the pools of a shard: %s\n",
                 pools.status().ToString().c_str());
    return 2;
  }
  const kvc::client::PoolInfo* pool = ChoosePool(*pools);
  std::vector<std::string> shard_names;
  for (const auto& s : cluster.Shards()) {
    if (!s.shard.empty()) shard_names.push_back(s.shard);
  }
  return RunPrefill(cluster, pool, client_options, /*per_shard=*/true, shard_names, [&] {
    kvc::client::PoolStats sum;
    int answered = 0, known = 0;
    for (const auto& s : cluster.Shards()) {
      ++known;
      auto endpoint = cluster.EndpointClient(s.address);
      if (!endpoint.ok()) continue;
      auto stats = kvc::client::AdminClient::Over(**endpoint).GetPoolStats(pool->name);
      if (!stats.ok()) continue;
      ++answered;
      sum.used_bytes += stats->used_bytes;
      sum.capacity_bytes += stats->capacity_bytes;
      sum.sequences += stats->sequences;
      sum.visible_tokens += stats->visible_tokens;
    }
    std::printf(
        "  pool now         %s of %s used, %lld sequences, %lld visible tokens (%d of %d "
        "shards)\n",
        Human(static_cast<double>(sum.used_bytes)).c_str(),
        Human(static_cast<double>(sum.capacity_bytes)).c_str(),
        static_cast<long long>(sum.sequences), static_cast<long long>(sum.visible_tokens), answered,
        known);
  });
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("kvc-loadgen: drive a prefill-style KV workload through kvcached");
  absl::ParseCommandLine(argc, argv);
  kvc::client::ClientOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.default_deadline = absl::GetFlag(FLAGS_deadline);
  options.local_reads = absl::GetFlag(FLAGS_local_reads);
  if (absl::Status status = kvc::cli::ApplySecurityFlags(&options); !status.ok()) {
    std::fprintf(stderr, "kvc-loadgen: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "prefill" && mode != "mixed") {
    std::fprintf(stderr, "kvc-loadgen: --mode is '%s'; expected prefill or mixed\n", mode.c_str());
    return 1;
  }
  const bool has_targets = !absl::GetFlag(FLAGS_targets).empty();
  const bool has_dns = !absl::GetFlag(FLAGS_dns).empty();
  const absl::CommandLineFlag* target_flag = absl::FindCommandLineFlag("target");
  const bool has_target = target_flag->CurrentValue() != target_flag->DefaultValue();
  if (int(has_targets) + int(has_dns) + int(has_target) > 1) {
    std::fprintf(stderr, "kvc-loadgen: give one of --target, --targets, --dns\n");
    return 1;
  }
  if (has_targets || has_dns) {
    if (mode != "prefill") {
      std::fprintf(stderr, "kvc-loadgen: --targets/--dns drive --mode=prefill only\n");
      return 1;
    }
    return RunCluster(options);
  }
  auto client_or = KvCacheClient::Connect(options);
  if (!client_or.ok()) {
    std::fprintf(stderr, "kvc-loadgen: %s\n", client_or.status().ToString().c_str());
    return 1;
  }
  KvCacheClient& client = **client_or;
  auto pools = kvc::client::AdminClient::Over(client).ListPools();
  if (!pools.ok()) {
    std::fprintf(stderr, "kvc-loadgen: cannot reach kvcached at %s: %s\n", options.target.c_str(),
                 pools.status().ToString().c_str());
    return 2;
  }
  const kvc::client::PoolInfo* pool = ChoosePool(*pools);
  if (mode == "mixed") {
    kvc::loadgen::MixedOptions mixed;
    mixed.tenant = absl::GetFlag(FLAGS_tenant);
    if (mixed.tenant.empty() && options.bearer_token.empty() && options.tls.cert_file.empty()) {
      mixed.tenant = "loadgen";
    }
    mixed.clients = std::max(1, absl::GetFlag(FLAGS_clients));
    mixed.duration = absl::GetFlag(FLAGS_duration);
    mixed.min_tokens = std::max(1, absl::GetFlag(FLAGS_min_tokens));
    mixed.max_tokens = std::max(mixed.min_tokens, absl::GetFlag(FLAGS_max_tokens));
    mixed.chunk_tokens = std::max(1, absl::GetFlag(FLAGS_chunk_tokens));
    mixed.server_pid = absl::GetFlag(FLAGS_server_pid);
    mixed.report_interval = absl::GetFlag(FLAGS_report_interval);
    mixed.json_path = absl::GetFlag(FLAGS_json);
    mixed.expect_server_loss = absl::GetFlag(FLAGS_expect_server_loss);
    mixed.settle = absl::GetFlag(FLAGS_settle);
    mixed.seed = absl::GetFlag(FLAGS_seed);
    if (pool->geometry.dtype != kvc::client::DType::kF16) {
      std::fprintf(stderr, "kvc-loadgen: --mode=mixed checks bytes of an f16 pool; '%s' is %s\n",
                   pool->name.c_str(), kvc::client::DTypeName(pool->geometry.dtype));
      return 1;
    }
    return kvc::loadgen::RunMixed(client, *pool, mixed);
  }
  return RunPrefill(client, pool, options, /*per_shard=*/false, {}, [&] {
    auto stats = kvc::client::AdminClient::Over(client).GetPoolStats(pool->name);
    if (stats.ok()) {
      std::printf("  pool now         %s of %s used, %lld sequences, %lld visible tokens\n",
                  Human(static_cast<double>(stats->used_bytes)).c_str(),
                  Human(static_cast<double>(stats->capacity_bytes)).c_str(),
                  static_cast<long long>(stats->sequences),
                  static_cast<long long>(stats->visible_tokens));
    }
  });
}
