#include "client/cli/cluster_commands.h"

#include <grpcpp/grpcpp.h>

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
#include "client/cli/conn.h"
#include "client/cli/flags.h"
#include "client/cli/print.h"
#include "client/cli/security_flags.h"
#include "client/cli/table.h"
#include "kvc/client/cluster_client.h"
#include "kvcache/v1/admin_service.grpc.pb.h"

namespace kvc::cli {

namespace pb = ::kvcache::v1;

namespace {

using kvc::client::ClusterClient;
using kvc::client::ShardState;
using kvc::client::ShardStatus;

// `s` as a JSON string. The cluster JSON ({shards, total}) is no kvcache.v1 message, so it is
// written by hand around each shard's protobuf JSON.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

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
  grpc::Status rpc;  // ok, or why it did not answer
  std::string json;  // its response as JSON, when ok
  std::string Label() const { return status.shard.empty() ? "?" : status.shard; }
  std::string Error() const {
    return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(rpc.error_code())),
                        ": ", rpc.error_message());
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
    const bool unreachable = a.rpc.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             a.rpc.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
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

// Calls `call` on every shard (in order) and collects the answers.
template <typename Response, typename Call>
std::vector<ShardAnswer> AskEveryShard(const std::vector<ShardStatus>& shards,
                                       std::vector<Response>* responses, Call call) {
  std::vector<ShardAnswer> answers;
  responses->clear();
  for (const ShardStatus& s : shards) {
    ShardAnswer a;
    a.status = s;
    Response response;
    auto conn = Dial(s.address);
    if (!conn.ok()) {
      a.rpc =
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(conn.status().message()));
    } else {
      auto stub = pb::AdminService::NewStub(conn->channel);
      grpc::ClientContext context;
      PrepareContext(*conn, absl::GetFlag(FLAGS_timeout_ms), &context);
      a.rpc = call(stub.get(), &context, &response);
      if (a.rpc.ok()) a.json = Json(response);
    }
    answers.push_back(std::move(a));
    responses->push_back(std::move(response));
  }
  return answers;
}

void AddFormats(google::protobuf::RepeatedPtrField<pb::FormatBytes>* into,
                const google::protobuf::RepeatedPtrField<pb::FormatBytes>& from) {
  for (const auto& fb : from) {
    pb::FormatBytes* slot = nullptr;
    for (auto& have : *into) {
      if (have.format() == fb.format()) slot = &have;
    }
    if (slot == nullptr) {
      slot = into->Add();
      slot->set_format(fb.format());
    }
    slot->set_blocks(slot->blocks() + fb.blocks());
    slot->set_bytes(slot->bytes() + fb.bytes());
  }
}

int ClusterPools(const std::vector<ShardStatus>& shards, bool json) {
  std::vector<pb::ListPoolsResponse> responses;
  auto answers = AskEveryShard(shards, &responses,
                               [](pb::AdminService::Stub* stub, grpc::ClientContext* context,
                                  pb::ListPoolsResponse* response) {
                                 return stub->ListPools(context, pb::ListPoolsRequest(), response);
                               });
  // Total: the pools summed by name (geometry of the first shard that has the pool).
  pb::ListPoolsResponse total;
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    for (const auto& p : responses[i].pools()) {
      pb::PoolInfo* slot = nullptr;
      for (auto& have : *total.mutable_pools()) {
        if (have.name() == p.name()) slot = &have;
      }
      if (slot == nullptr) {
        slot = total.add_pools();
        *slot = p;
        continue;
      }
      slot->set_capacity_bytes(slot->capacity_bytes() + p.capacity_bytes());
      slot->set_total_blocks(slot->total_blocks() + p.total_blocks());
      slot->set_free_blocks(slot->free_blocks() + p.free_blocks());
      slot->set_used_bytes(slot->used_bytes() + p.used_bytes());
      slot->set_sequences(slot->sequences() + p.sequences());
      if (slot->device() != p.device()) slot->set_device("mixed");
    }
  }
  if (json) {
    std::cout << ClusterJson(answers, Json(total));
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "POOL", "DEVICE", "LAYERS", "KV_HEADS", "Q_HEADS", "HEAD_DIM", "DTYPE",
               "BLOCK", "CAPACITY", "USED", "FREE_BLOCKS", "SEQUENCES"});
  auto add = [&](const std::string& shard, const pb::PoolInfo& p) {
    const auto& g = p.geometry();
    table.AddRow(
        {shard, p.name(), p.device(), absl::StrCat(g.num_layers()), absl::StrCat(g.num_kv_heads()),
         absl::StrCat(g.num_query_heads()), absl::StrCat(g.head_dim()), DTypeName(g.dtype()),
         absl::StrCat(g.block_tokens(), " tok/", FormatBytes(p.block_bytes())),
         FormatBytes(p.capacity_bytes()), FormatBytes(p.used_bytes()),
         absl::StrCat(p.free_blocks(), "/", p.total_blocks()), absl::StrCat(p.sequences())});
  };
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    for (const auto& p : responses[i].pools()) add(answers[i].Label(), p);
  }
  for (const auto& p : total.pools()) add("total", p);
  std::cout << table.Render();
  return ReportShards(answers, json);
}

pb::PoolStats SumStats(const std::vector<ShardAnswer>& answers,
                       const std::vector<pb::PoolStats>& responses) {
  pb::PoolStats total;
  total.set_pool(absl::GetFlag(FLAGS_pool));
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    const pb::PoolStats& s = responses[i];
    total.set_capacity_bytes(total.capacity_bytes() + s.capacity_bytes());
    total.set_used_bytes(total.used_bytes() + s.used_bytes());
    total.set_free_bytes(total.free_bytes() + s.free_bytes());
    total.set_total_blocks(total.total_blocks() + s.total_blocks());
    total.set_used_blocks(total.used_blocks() + s.used_blocks());
    total.set_sequences(total.sequences() + s.sequences());
    total.set_visible_tokens(total.visible_tokens() + s.visible_tokens());
    total.set_stored_token_heads(total.stored_token_heads() + s.stored_token_heads());
    AddFormats(total.mutable_bytes_by_format(), s.bytes_by_format());
    total.set_appended_bytes_total(total.appended_bytes_total() + s.appended_bytes_total());
    total.set_fetched_bytes_total(total.fetched_bytes_total() + s.fetched_bytes_total());
    total.set_dense_bytes(total.dense_bytes() + s.dense_bytes());
    for (const auto& [rule, n] : s.evicted_token_heads()) {
      (*total.mutable_evicted_token_heads())[rule] += n;
    }
    if (s.has_prefix_cache()) {  // pool-wide statistics; each shard has its own cache
      const pb::PrefixCacheStats& c = s.prefix_cache();
      pb::PrefixCacheStats* t = total.mutable_prefix_cache();
      t->set_lookups(t->lookups() + c.lookups());
      t->set_hits(t->hits() + c.hits());
      t->set_lookup_tokens(t->lookup_tokens() + c.lookup_tokens());
      t->set_hit_tokens(t->hit_tokens() + c.hit_tokens());
      t->set_attached_tokens(t->attached_tokens() + c.attached_tokens());
      t->set_checksum_misses(t->checksum_misses() + c.checksum_misses());
      t->set_published_entries(t->published_entries() + c.published_entries());
      t->set_evicted_entries(t->evicted_entries() + c.evicted_entries());
      t->set_entries(t->entries() + c.entries());
      t->set_cached_bytes(t->cached_bytes() + c.cached_bytes());
      t->set_unreferenced_bytes(t->unreferenced_bytes() + c.unreferenced_bytes());
      t->set_corrupt_reads(t->corrupt_reads() + c.corrupt_reads());
      t->set_evicted_misses(t->evicted_misses() + c.evicted_misses());
    }
    if (s.has_leases()) {
      const pb::LeaseStats& l = s.leases();
      pb::LeaseStats* t = total.mutable_leases();
      t->set_active(t->active() + l.active());
      t->set_leased_bytes(t->leased_bytes() + l.leased_bytes());
      t->set_granted(t->granted() + l.granted());
      t->set_renewed(t->renewed() + l.renewed());
      t->set_released(t->released() + l.released());
      t->set_expired(t->expired() + l.expired());
      t->set_lease_only_bytes(t->lease_only_bytes() + l.lease_only_bytes());
    }
    // A tenant's view: the tenant and its per-shard limits are the same on every shard.
    if (!s.tenant().empty()) {
      total.set_tenant(s.tenant());
      total.set_quota_bytes(s.quota_bytes());
      total.set_quota_sequences(s.quota_sequences());
    }
  }
  return total;
}

std::vector<ShardAnswer> AskStats(const std::vector<ShardStatus>& shards,
                                  std::vector<pb::PoolStats>* responses) {
  return AskEveryShard(
      shards, responses,
      [](pb::AdminService::Stub* stub, grpc::ClientContext* context, pb::PoolStats* response) {
        pb::GetPoolStatsRequest request;
        request.set_pool(absl::GetFlag(FLAGS_pool));
        return stub->GetPoolStats(context, request, response);
      });
}

int ClusterStats(const std::vector<ShardStatus>& shards, bool json) {
  std::vector<pb::PoolStats> responses;
  auto answers = AskStats(shards, &responses);
  const pb::PoolStats total = SumStats(answers, responses);
  if (json) {
    std::cout << ClusterJson(answers, Json(total));
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "POOL", "CAPACITY", "USED", "FREE", "BLOCKS", "SEQUENCES", "VISIBLE_TOKENS",
               "STORED_TOKEN_HEADS", "APPENDED", "FETCHED", "PREFIX_ENTRIES", "PREFIX_CACHED",
               "PREFIX_HIT_RATE"});
  auto add = [&](const std::string& shard, const pb::PoolStats& s) {
    const bool prefix = s.has_prefix_cache();  // none in a tenant's view
    const pb::PrefixCacheStats& c = s.prefix_cache();
    table.AddRow({shard, s.pool().empty() ? "(all)" : s.pool(), FormatBytes(s.capacity_bytes()),
                  FormatBytes(s.used_bytes()), FormatBytes(s.free_bytes()),
                  absl::StrCat(s.used_blocks(), "/", s.total_blocks()), absl::StrCat(s.sequences()),
                  absl::StrCat(s.visible_tokens()), absl::StrCat(s.stored_token_heads()),
                  FormatBytes(s.appended_bytes_total()), FormatBytes(s.fetched_bytes_total()),
                  prefix ? absl::StrCat(c.entries()) : "-",
                  prefix ? FormatBytes(c.cached_bytes()) : "-", prefix ? PrefixHitRate(c) : "-"});
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
  std::vector<pb::ListSequencesResponse> responses;
  auto answers = AskEveryShard(
      shards, &responses,
      [limit](pb::AdminService::Stub* stub, grpc::ClientContext* context,
              pb::ListSequencesResponse* response) {
        pb::ListSequencesRequest request;
        request.set_pool(absl::GetFlag(FLAGS_pool));
        request.set_tenant(absl::GetFlag(FLAGS_tenant));
        request.set_limit(limit);  // each shard's best `limit`: enough for the overall cut
        return stub->ListSequences(context, request, response);
      });
  // Merged, sorted, then cut to --limit (the server default, 1000, when 0) overall.
  pb::ListSequencesResponse total;
  std::map<std::string, std::string> shard_of;  // sequence id -> shard label
  for (size_t i = 0; i < answers.size(); ++i) {
    if (!answers[i].rpc.ok()) continue;
    SortSequences(&responses[i], sort);
    answers[i].json = Json(responses[i]);
    total.set_total(total.total() + responses[i].total());
    for (const auto& s : responses[i].sequences()) {
      *total.add_sequences() = s;
      shard_of[s.sequence_id()] = answers[i].Label();
    }
  }
  SortSequences(&total, sort);
  const int cut = limit > 0 ? limit : 1000;
  while (total.sequences_size() > cut) total.mutable_sequences()->RemoveLast();
  if (json) {
    std::cout << ClusterJson(answers, Json(total));
    return ReportShards(answers, json);
  }
  Table table({"SHARD", "SEQUENCE", "POOL", "TENANT", "TOKENS", "STORED_TOKEN_HEADS", "BYTES",
               "RATIO", "FORMATS"});
  for (const auto& s : total.sequences()) {
    std::string formats;
    for (const auto& fb : s.bytes_by_format()) {
      absl::StrAppend(&formats, formats.empty() ? "" : ",", FormatName(fb.format()));
    }
    table.AddRow({shard_of[s.sequence_id()], s.sequence_id(), s.pool(),
                  s.tenant().empty() ? "-" : s.tenant(), absl::StrCat(s.visible_tokens()),
                  absl::StrCat(s.stored_token_heads()), FormatBytes(s.bytes()),
                  absl::StrFormat("%.2f", s.compression_ratio()), formats.empty() ? "-" : formats});
  }
  std::cout << table.Render();
  int answered = 0;
  for (const ShardAnswer& a : answers) answered += a.rpc.ok();
  std::cout << "total: " << total.total() << " sequences on " << answered << " of "
            << answers.size() << " shards";
  if (total.total() > total.sequences_size()) {
    std::cout << " (" << total.sequences_size() << " shown; raise --limit)";
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
  std::vector<pb::PoolStats> responses;
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
  const pb::PoolStats total = SumStats(answers, responses);
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
                        static_cast<int>(shards.size()), serving, Indent(Json(total), "  ")),
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
         absl::StrFormat("%.1f%%", share(s)), ok ? absl::StrCat(responses[i].sequences()) : "-",
         ok ? FormatBytes(responses[i].used_bytes()) : "-"});
  }
  table.AddRow({"total", absl::StrCat(shards.size(), " shards"), "",
                absl::StrCat(serving, " serving"), "", absl::StrFormat("%g", serving_weight),
                serving > 0 ? "100.0%" : "0.0%", absl::StrCat(total.sequences()),
                FormatBytes(total.used_bytes())});
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
