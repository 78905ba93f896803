#include "client/cli/cluster_commands.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/admin_json.h"
#include "client/cli/conn.h"
#include "client/cli/flags.h"
#include "client/cli/json.h"
#include "client/cli/print.h"
#include "client/cli/security_flags.h"
#include "client/cli/table.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/cluster_client.h"

namespace kvc::cli {

namespace {

using kvc::client::AdminClient;
using kvc::client::ClusterClient;
using kvc::client::PoolInfo;
using kvc::client::PoolStats;
using kvc::client::SequenceList;
using kvc::client::ShardState;
using kvc::client::ShardStatus;

// `json` with `pad` after each newline and no trailing whitespace, to nest it in the cluster
// JSON at that depth.
std::string Indent(std::string json, const std::string& pad) {
  while (!json.empty() && (json.back() == '\n' || json.back() == ' ')) json.pop_back();
  std::string out;
  for (char c : json) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

// What one shard answered.
struct ShardAnswer {
  ShardStatus status;
  absl::Status rpc;  // ok, or why it did not answer
  std::string json;  // its response as JSON, when ok
  std::string Label() const { return status.shard.empty() ? "?" : status.shard; }
  std::string Error() const {
    return absl::StrCat(absl::StatusCodeToString(rpc.code()), ": ", rpc.message());
  }
};

// {"shards":[{"shard":..,"address":..,"result":{..}|"error":".."}],"total":{..}}
std::string ClusterJson(const std::vector<ShardAnswer>& answers, const std::string& total_json,
                        const std::function<std::string(const ShardAnswer&)>& extra = nullptr) {
  std::string out = "{\n  \"shards\": [";
  for (size_t i = 0; i < answers.size(); ++i) {
    const ShardAnswer& a = answers[i];
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "    {\n      \"shard\": ", Quote(a.status.shard),
                    ",\n      \"address\": ", Quote(a.status.address));
    if (extra) absl::StrAppend(&out, extra(a));
    if (a.rpc.ok()) {
      absl::StrAppend(&out, ",\n      \"result\": ", Indent(a.json, "      "));
    } else {
      absl::StrAppend(&out, ",\n      \"error\": ", Quote(a.Error()));
    }
    absl::StrAppend(&out, "\n    }");
  }
  absl::StrAppend(&out, "\n  ],\n  \"total\": ", Indent(total_json, "  "), "\n}\n");
  return out;
}

// 0 when every shard answered; 2 when one could not be reached, 3 when one refused. The
// shards that did not answer are listed on stdout (after the table) and stderr.
int ReportShards(const std::vector<ShardAnswer>& answers, bool json) {
  int rc = 0, failed = 0;
  for (const ShardAnswer& a : answers) {
    if (a.rpc.ok()) continue;
    ++failed;
    const bool unreachable = absl::IsUnavailable(a.rpc) || absl::IsDeadlineExceeded(a.rpc);
    rc = std::max(rc, unreachable ? 2 : 3);
    if (!json) {
      std::cout << "shard " << a.Label() << " at " << a.status.address
                << (unreachable ? " did not answer: " : " refused: ") << a.Error() << "\n";
    }
  }
  if (failed > 0) {
    std::fprintf(stderr, "kvcachectl: %d of %zu shards did not answer\n", failed, answers.size());
  }
  return rc;
}

// Every shard the cluster client knows once each has answered or failed once (or
// --timeout_ms passed), in address order.
std::vector<ShardStatus> Discover(const ClusterClient& cluster, bool dns) {
  const absl::Duration timeout = absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  const absl::Time deadline = absl::Now() + timeout;
  // All shards serving is the common case and returns at once.
  (void)cluster.WaitForShards(dns ? 1 : static_cast<int>(cluster.Shards().size()),
                              std::min(timeout, absl::Milliseconds(200)));
  for (;;) {
    std::vector<ShardStatus> shards = cluster.Shards();
    bool settled = !shards.empty();
    for (const ShardStatus& s : shards) {
      if (s.state == ShardState::kConnecting && s.last_error.empty()) settled = false;
    }
    if (settled || absl::Now() >= deadline) return shards;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Calls `call` (an AdminClient, the call options -> StatusOr<Response>) on every shard (in
// order) and collects the answers; a shard that did not answer has a default Response.
template <typename Response, typename Call>
std::vector<ShardAnswer> AskEveryShard(const std::vector<ShardStatus>& shards,
                                       std::vector<Response>* responses, Call call) {
  std::vector<ShardAnswer> answers;
  responses->clear();
  for (const ShardStatus& s : shards) {
    ShardAnswer a;
    a.status = s;
    Response response{};
    auto admin = Dial(s.address);
    if (!admin.ok()) {
      a.rpc = absl::InvalidArgumentError(admin.status().message());
    } else {
      absl::StatusOr<Response> answer = call(**admin, kvc::cli::Call());
      a.rpc = answer.status();
      if (answer.ok()) {
        response = *std::move(answer);
        a.json = JsonOf(response).Render();
      }
    }
    answers.push_back(std::move(a));
    responses->push_back(std::move(response));
  }
  return answers;
}

void AddFormats(std::vector<client::FormatBytes>* into,
                const std::vector<client::FormatBytes>& from) {
  for (const client::FormatBytes& fb : from) {
    client::FormatBytes* slot = nullptr;
    for (client::FormatBytes& have : *into) {
      if (have.format == fb.format) slot = &have;
    }
    if (slot == nullptr) {
      slot = &into->emplace_back();
      slot->format = fb.format;
    }
    slot->blocks += fb.blocks;
    slot->bytes += fb.bytes;
  }
}

int ClusterPools(const std::vector<ShardStatus>& shards, bool json) {
  std::vector<std::vector<PoolInfo>> responses;
  auto answers = AskEveryShard(shards, &responses,
                               [](const AdminClient& admin, const client::CallOptions& call) {
                                 return admin.ListPools(call);
                               });
  // Total: the pools summed by name (geometry of the first shard that has the pool).
  std::vector<PoolInfo> total;
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    for (const PoolInfo& p : responses[i]) {
      PoolInfo* slot = nullptr;
      for (PoolInfo& have : total) {
        if (have.name == p.name) slot = &have;
      }
      if (slot == nullptr) {
        total.push_back(p);
        continue;
      }
      slot->capacity_bytes += p.capacity_bytes;
      slot->total_blocks += p.total_blocks;
      slot->free_blocks += p.free_blocks;
      slot->used_bytes += p.used_bytes;
      slot->sequences += p.sequences;
      if (slot->device != p.device) slot->device = "mixed";
    }
  }
  if (json) {
    std::cout << ClusterJson(answers, JsonOf(total).Render());
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "POOL", "DEVICE", "LAYERS", "KV_HEADS", "Q_HEADS", "HEAD_DIM", "DTYPE",
               "BLOCK", "CAPACITY", "USED", "FREE_BLOCKS", "SEQUENCES"});
  auto add = [&](const std::string& shard, const PoolInfo& p) {
    const client::PoolGeometry& g = p.geometry;
    table.AddRow({shard, p.name, p.device, absl::StrCat(g.num_layers), absl::StrCat(g.num_kv_heads),
                  absl::StrCat(g.num_query_heads), absl::StrCat(g.head_dim), DTypeLabel(g.dtype),
                  absl::StrCat(g.block_tokens, " tok/", FormatBytes(p.block_bytes)),
                  FormatBytes(p.capacity_bytes), FormatBytes(p.used_bytes),
                  absl::StrCat(p.free_blocks, "/", p.total_blocks), absl::StrCat(p.sequences)});
  };
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    for (const PoolInfo& p : responses[i]) add(answers[i].Label(), p);
  }
  for (const PoolInfo& p : total) add("total", p);
  std::cout << table.Render();
  return ReportShards(answers, json);
}

PoolStats SumStats(const std::vector<ShardAnswer>& answers,
                   const std::vector<PoolStats>& responses) {
  PoolStats total;
  total.pool = absl::GetFlag(FLAGS_pool);
  std::map<std::string, int64_t> evicted;  // by rule
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    const PoolStats& s = responses[i];
    total.capacity_bytes += s.capacity_bytes;
    total.used_bytes += s.used_bytes;
    total.free_bytes += s.free_bytes;
    total.total_blocks += s.total_blocks;
    total.used_blocks += s.used_blocks;
    total.sequences += s.sequences;
    total.visible_tokens += s.visible_tokens;
    total.stored_token_heads += s.stored_token_heads;
    AddFormats(&total.bytes_by_format, s.bytes_by_format);
    total.appended_bytes_total += s.appended_bytes_total;
    total.fetched_bytes_total += s.fetched_bytes_total;
    total.dense_bytes += s.dense_bytes;
    for (const auto& [rule, n] : s.evicted_token_heads) evicted[rule] += n;
    if (s.has_prefix_cache) {  // pool-wide statistics; each shard has its own cache
      const PoolStats::PrefixCache& c = s.prefix_cache;
      PoolStats::PrefixCache& t = total.prefix_cache;
      total.has_prefix_cache = true;
      t.lookups += c.lookups;
      t.hits += c.hits;
      t.lookup_tokens += c.lookup_tokens;
      t.hit_tokens += c.hit_tokens;
      t.attached_tokens += c.attached_tokens;
      t.checksum_misses += c.checksum_misses;
      t.published_entries += c.published_entries;
      t.evicted_entries += c.evicted_entries;
      t.entries += c.entries;
      t.cached_bytes += c.cached_bytes;
      t.unreferenced_bytes += c.unreferenced_bytes;
      t.corrupt_reads += c.corrupt_reads;
      t.evicted_misses += c.evicted_misses;
    }
    if (s.has_leases) {
      const PoolStats::Leases& l = s.leases;
      PoolStats::Leases& t = total.leases;
      total.has_leases = true;
      t.active += l.active;
      t.leased_bytes += l.leased_bytes;
      t.granted += l.granted;
      t.renewed += l.renewed;
      t.released += l.released;
      t.expired += l.expired;
      t.lease_only_bytes += l.lease_only_bytes;
    }
    // A tenant's view: the tenant and its per-shard limits are the same on every shard.
    if (!s.tenant.empty()) {
      total.tenant = s.tenant;
      total.quota_bytes = s.quota_bytes;
      total.quota_sequences = s.quota_sequences;
    }
  }
  total.evicted_token_heads.assign(evicted.begin(), evicted.end());
  return total;
}

std::vector<ShardAnswer> AskStats(const std::vector<ShardStatus>& shards,
                                  std::vector<PoolStats>* responses) {
  return AskEveryShard(shards, responses,
                       [](const AdminClient& admin, const client::CallOptions& call) {
                         return admin.GetPoolStats(absl::GetFlag(FLAGS_pool), call);
                       });
}

int ClusterStats(const std::vector<ShardStatus>& shards, bool json) {
  std::vector<PoolStats> responses;
  auto answers = AskStats(shards, &responses);
  const PoolStats total = SumStats(answers, responses);
  if (json) {
    std::cout << ClusterJson(answers, JsonOf(total).Render());
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "POOL", "CAPACITY", "USED", "FREE", "BLOCKS", "SEQUENCES", "VISIBLE_TOKENS",
               "STORED_TOKEN_HEADS", "APPENDED", "FETCHED", "PREFIX_ENTRIES", "PREFIX_CACHED",
               "PREFIX_HIT_RATE"});
  auto add = [&](const std::string& shard, const PoolStats& s) {
    const bool prefix = s.has_prefix_cache;  // none in a tenant's view
    const PoolStats::PrefixCache& c = s.prefix_cache;
    table.AddRow({shard, s.pool.empty() ? "(all)" : s.pool, FormatBytes(s.capacity_bytes),
                  FormatBytes(s.used_bytes), FormatBytes(s.free_bytes),
                  absl::StrCat(s.used_blocks, "/", s.total_blocks), absl::StrCat(s.sequences),
                  absl::StrCat(s.visible_tokens), absl::StrCat(s.stored_token_heads),
                  FormatBytes(s.appended_bytes_total), FormatBytes(s.fetched_bytes_total),
                  prefix ? absl::StrCat(c.entries) : "-",
                  prefix ? FormatBytes(c.cached_bytes) : "-", prefix ? PrefixHitRate(c) : "-"});
  };
  for (size_t i = 0; i < answers.size(); ++i) {
    if (answers[i].rpc.ok()) add(answers[i].Label(), responses[i]);
  }
  add("total", total);
  std::cout << table.Render();
  return ReportShards(answers, json);
}

int ClusterSequences(const std::vector<ShardStatus>& shards, bool json) {
  const std::string sort = absl::GetFlag(FLAGS_sort);
  if (!ValidSort(sort)) return 2;
  const int limit = absl::GetFlag(FLAGS_limit);
  std::vector<SequenceList> responses;
  auto answers = AskEveryShard(
      shards, &responses, [limit](const AdminClient& admin, const client::CallOptions& call) {
        client::ListSequencesOptions options;
        options.pool = absl::GetFlag(FLAGS_pool);
        options.tenant = absl::GetFlag(FLAGS_tenant);
        options.limit = limit;  // each shard's best `limit`: enough for the overall cut
        return admin.ListSequences(options, call);
      });
  // Merged, sorted, then cut to --limit (the server default, 1000, when 0) overall.
  SequenceList total;
  std::map<std::string, std::string> shard_of;  // sequence id -> shard label
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    SortSequences(&responses[i].sequences, sort);
    answers[i].json = JsonOf(responses[i]).Render();
    total.total += responses[i].total;
    for (const client::SequenceInfo& s : responses[i].sequences) {
      total.sequences.push_back(s);
      shard_of[s.sequence_id] = answers[i].Label();
    }
  }
  SortSequences(&total.sequences, sort);
  const size_t cut = limit > 0 ? limit : 1000;
  if (total.sequences.size() > cut) total.sequences.resize(cut);
  if (json) {
    std::cout << ClusterJson(answers, JsonOf(total).Render());
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "SEQUENCE", "POOL", "TENANT", "TOKENS", "STORED_TOKEN_HEADS", "BYTES",
               "RATIO", "FORMATS"});
  for (const client::SequenceInfo& s : total.sequences) {
    std::string formats;
    for (const client::FormatBytes& fb : s.bytes_by_format) {
      absl::StrAppend(&formats, formats.empty() ? "" : ",", FormatName(fb.format));
    }
    table.AddRow({shard_of[s.sequence_id], s.sequence_id, s.pool, s.tenant.empty() ? "-" : s.tenant,
                  absl::StrCat(s.visible_tokens), absl::StrCat(s.stored_token_heads),
                  FormatBytes(s.bytes), absl::StrFormat("%.2f", s.compression_ratio),
                  formats.empty() ? "-" : formats});
  }
  std::cout << table.Render();
  int answered = 0;
  for (const ShardAnswer& a : answers) answered += a.rpc.ok();
  std::cout << "total: " << total.total << " sequences on " << answered << " of " << answers.size()
            << " shards";
  if (total.total > static_cast<int64_t>(total.sequences.size())) {
    std::cout << " (" << total.sequences.size() << " shown; raise --limit)";
  }
  std::cout << "\n";
  return ReportShards(answers, json);
}

std::string StateName(const ShardStatus& s) {
  // Never reached since this process started: say so rather than "connecting".
  if (s.state == ShardState::kConnecting && !s.last_error.empty()) return "unreachable";
  return kvc::client::ShardStateName(s.state);
}

int ClusterShards(const std::vector<ShardStatus>& shards, bool json) {
  std::vector<PoolStats> responses;
  auto answers = AskStats(shards, &responses);
  double serving_weight = 0;
  int serving = 0;
  for (const ShardStatus& s : shards) {
    if (s.state == ShardState::kServing) {
      serving_weight += s.weight;
      ++serving;
    }
  }
  auto share = [&](const ShardStatus& s) {
    return s.state == ShardState::kServing && serving_weight > 0 ? 100.0 * s.weight / serving_weight
                                                                 : 0.0;
  };
  const PoolStats total = SumStats(answers, responses);
  if (json) {
    auto extra = [&](const ShardAnswer& a) {
      const ShardStatus& s = a.status;
      return absl::StrFormat(
          ",\n      \"incarnation\": %s,\n      \"state\": %s,\n      \"listed\": %s,\n"
          "      \"weight\": %g,\n      \"placement_share_percent\": %.2f,\n"
          "      \"last_error\": %s",
          Quote(s.incarnation), Quote(StateName(s)), s.listed ? "true" : "false", s.weight,
          share(s), Quote(s.last_error));
    };
    std::cout << ClusterJson(
        answers,
        absl::StrFormat("{\n  \"shards\": %d,\n  \"serving\": %d,\n  \"stats\": %s\n}",
                        static_cast<int>(shards.size()), serving,
                        Indent(JsonOf(total).Render(), "  ")),
        extra);
    return ReportShards(answers, json);
  }
  Table table({"ADDRESS", "SHARD", "INCARNATION", "STATE", "LISTED", "WEIGHT", "SHARE", "SEQUENCES",
               "USED"});
  for (size_t i = 0; i < answers.size(); ++i) {
    const ShardStatus& s = answers[i].status;
    const bool ok = answers[i].rpc.ok();
    table.AddRow(
        {s.address, s.shard.empty() ? "?" : s.shard, s.incarnation.empty() ? "-" : s.incarnation,
         StateName(s), s.listed ? "yes" : "no", absl::StrFormat("%g", s.weight),
         absl::StrFormat("%.1f%%", share(s)), ok ? absl::StrCat(responses[i].sequences) : "-",
         ok ? FormatBytes(responses[i].used_bytes) : "-"});
  }
  table.AddRow({"total", absl::StrCat(shards.size(), " shards"), "",
                absl::StrCat(serving, " serving"), "", absl::StrFormat("%g", serving_weight),
                serving > 0 ? "100.0%" : "0.0%", absl::StrCat(total.sequences),
                FormatBytes(total.used_bytes)});
  std::cout << table.Render();
  return ReportShards(answers, json);
}

// The address of the shard named `name`, or "" (and the known names on stderr).
std::string AddressOfShard(const std::vector<ShardStatus>& shards, const std::string& name) {
  for (const ShardStatus& s : shards) {
    if (s.shard == name) return s.address;
  }
  std::vector<std::string> known;
  known.reserve(shards.size());
  for (const ShardStatus& s : shards) {
    known.push_back(
        absl::StrCat(s.shard.empty() ? "?" : s.shard, "@", s.address, " (", StateName(s), ")"));
  }
  std::fprintf(stderr, "kvcachectl: no shard named '%s' answers; shards: %s\n", name.c_str(),
               absl::StrJoin(known, ", ").c_str());
  return "";
}

}  // namespace

int RunCluster(const std::string& command, const std::vector<char*>& args, bool json,
               const char* usage,
               const std::function<int(const std::string& address)>& run_on_shard) {
  const std::string targets = absl::GetFlag(FLAGS_targets);
  const std::string dns = absl::GetFlag(FLAGS_dns);
  if (command == "drain" && absl::GetFlag(FLAGS_shard).empty()) {
    std::fprintf(stderr,
                 "kvcachectl: drain with --targets/--dns needs --shard=NAME: draining every "
                 "shard at once stops the cache (see `kvcachectl cluster` for the names)\n");
    return 1;
  }
  if (command == "tenants" || command == "leases" || command == "end-lease") {
    std::fprintf(stderr,
                 "kvcachectl: %s is per kvcached; use --target=ADDRESS (see `kvcachectl "
                 "cluster` for the addresses)\n",
                 command.c_str());
    return 1;
  }
  kvc::client::ClusterOptions options;
  if (!targets.empty()) {
    options.targets = absl::StrSplit(targets, ',', absl::SkipWhitespace());
  }
  options.dns_name = dns;
  if (absl::Status status = kvc::cli::ApplySecurityFlags(&options.client); !status.ok()) {
    std::fprintf(stderr, "kvcachectl: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  options.health_timeout =
      std::min(options.health_timeout, absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  auto cluster_or = ClusterClient::Connect(options);
  if (!cluster_or.ok()) {
    std::fprintf(stderr, "kvcachectl: %s\n", std::string(cluster_or.status().message()).c_str());
    return 1;
  }
  const std::vector<ShardStatus> shards = Discover(**cluster_or, !dns.empty());
  if (shards.empty()) {
    std::fprintf(stderr, "kvcachectl: %s has no addresses (after %d ms)\n", dns.c_str(),
                 absl::GetFlag(FLAGS_timeout_ms));
    return 2;
  }
  if (command == "pools") return ClusterPools(shards, json);
  if (command == "stats") return ClusterStats(shards, json);
  if (command == "sequences") return ClusterSequences(shards, json);
  if (command == "cluster") return ClusterShards(shards, json);
  std::string name;
  if (command == "drain") {
    name = absl::GetFlag(FLAGS_shard);
  } else if (command == "evict" || command == "sequence") {
    const std::string id = command == "evict" ? args[2] : args[3];
    auto shard = ClusterClient::ShardOf(id);
    if (!shard.ok()) {
      std::fprintf(stderr, "kvcachectl: '%s' is not a cluster sequence id: %s\n", id.c_str(),
                   std::string(shard.status().message()).c_str());
      return 1;
    }
    name = *shard;
  } else {
    std::fprintf(stderr, "kvcachectl: unknown command '%s'\nusage: %s\n", command.c_str(), usage);
    return 1;
  }
  const std::string address = AddressOfShard(shards, name);
  if (address.empty()) return 2;
  return run_on_shard(address);
}

}  // namespace kvc::cli
