// kvcachectl: inspect a running kvcached.
//
//   kvcachectl [--target=host:port] [--json] pools
//   kvcachectl [--target=host:port] [--json] sequences [--pool=P] [--tenant=T] [--limit=N]
//   kvcachectl [--target=host:port] [--json] stats [--pool=P]
//   kvcachectl [--target=host:port] [--json] sequence show ID
//   kvcachectl [--target=host:port] evict ID
//   kvcachectl [--target=host:port] drain [--resume]
//   kvcachectl hash-token --tenant=T [--role=tenant|admin] [--generate] < token
//
// A cluster instead of one kvcached: --targets=host:port,host:port or --dns=host:port (every
// address of the name; a Kubernetes headless Service), exclusive with --target. Then pools,
// stats and sequences ask every shard and print a SHARD column plus a total; `cluster` lists
// the shards; evict and sequence show go to the shard the id names; drain needs --shard=NAME.
// A shard that does not answer is listed with its error and the exit code is non-zero.
//
// Human tables by default; --json prints the kvcache.v1 response as JSON for scripts.
// TLS and the bearer token: --tls_ca, --tls_cert, --tls_key, --tls_server_name, --token_file
// (or $KVC_TOKEN); see client/cli/security_flags.h.
// Exit codes: 0 ok, 1 usage error, 2 target unreachable, 3 the server refused the call.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/channel/channel.h"
#include "client/cli/hash_token.h"
#include "client/cli/security_flags.h"
#include "client/cli/table.h"
#include "google/protobuf/util/json_util.h"
#include "kvc/client/cluster_client.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "kvcached address (host:port or unix:/path)");
ABSL_FLAG(std::string, targets, "",
          "a cluster: comma-separated kvcached shard addresses (instead of --target)");
ABSL_FLAG(std::string, dns, "",
          "a cluster: host:port whose every DNS address is a shard (instead of --target)");
ABSL_FLAG(std::string, shard, "", "drain with --targets/--dns: the shard (by name) to drain");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(std::string, pool, "", "only this pool (sequences, stats)");
ABSL_FLAG(std::string, tenant, "",
          "only this tenant (sequences); the tenant whose sequence it is (sequence show, evict: "
          "an admin acting on another tenant's); the token's tenant (hash-token)");
ABSL_FLAG(int32_t, limit, 0, "at most this many sequences (0 = server default, 1000)");
ABSL_FLAG(int32_t, timeout_ms, 5000, "deadline of the call");
ABSL_FLAG(std::string, sort, "created",
          "sequences: order by created | tokens | bytes | id (largest first for tokens, bytes)");
ABSL_FLAG(bool, resume, false, "drain: accept new sequences again");
ABSL_FLAG(std::string, role, "tenant", "hash-token: the token's role, tenant or admin");
ABSL_FLAG(bool, generate, false,
          "hash-token: make a random 32-byte token and print it (hex) instead of reading stdin");

namespace {

namespace pb = ::kvcache::v1;
using kvc::cli::FormatBytes;
using kvc::cli::Table;

constexpr char kUsage[] =
    "kvcachectl [--target=host:port | --targets=h:p,h:p | --dns=host:port] [--json] <command>\n"
    "commands:\n"
    "  pools                                   pools, geometry and usage\n"
    "  sequences [--pool=P] [--tenant=T] [--limit=N]   live sequences\n"
    "  stats [--pool=P]                        usage summed over pools (or one pool)\n"
    "  sequence show ID [--tenant=T]           one sequence: lengths per layer, bytes\n"
    "  evict ID [--tenant=T]                   free a sequence (counted as evicted; admin)\n"
    "  tenants                                 what each tenant holds, its open calls, quotas\n"
    "  drain [--resume]                        stop (or resume) accepting new sequences\n"
    "  hash-token --tenant=T [--role=tenant|admin] [--generate]   tokens-file line for the\n"
    "                                          token on stdin (or a new one: 'token: <hex>')\n"
    "  cluster                                 (--targets/--dns) every shard: state, weight,\n"
    "                                          placement share, sequences, used bytes\n"
    "with --targets/--dns: pools, stats, sequences ask every shard (SHARD column, total);\n"
    "evict and sequence show go to the shard the id names; drain needs --shard=NAME\n"
    "sequences also takes --sort=created|tokens|bytes|id\n"
    "TLS: --tls_ca=FILE [--tls_cert=FILE --tls_key=FILE] [--tls_server_name=NAME]; bearer token:\n"
    "--token_file=FILE or $KVC_TOKEN";

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

const char* DTypeName(pb::DType dtype) {
  switch (dtype) {
    case pb::DTYPE_F32:
      return "f32";
    case pb::DTYPE_F16:
      return "f16";
    case pb::DTYPE_BF16:
      return "bf16";
    default:
      return "?";
  }
}

std::string FormatName(pb::StorageFormat format) {
  std::string name = pb::StorageFormat_Name(format);
  const std::string prefix = "STORAGE_FORMAT_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Prints the tokens-file line for a token read from stdin, or for a new one (then printed
// first as "token: <hex>"). The token is never a flag: it would show in ps.
int HashToken() {
  std::string token;
  if (absl::GetFlag(FLAGS_generate)) {
    auto generated = kvc::cli::GenerateToken();
    if (!generated.ok()) {
      std::fprintf(stderr, "kvcachectl: %s\n", std::string(generated.status().message()).c_str());
      return 1;
    }
    token = *std::move(generated);
  } else {
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    token = std::string(absl::StripAsciiWhitespace(input));
  }
  auto line =
      kvc::cli::TokensFileLine(absl::GetFlag(FLAGS_tenant), absl::GetFlag(FLAGS_role), token);
  if (!line.ok()) {
    std::fprintf(stderr, "kvcachectl hash-token: %s\n",
                 std::string(line.status().message()).c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_generate)) std::cout << "token: " << token << "\n";
  std::cout << *line << "\n";
  return 0;
}

int Report(const grpc::Status& status, const std::string& target) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::fprintf(stderr,
                 "kvcachectl: cannot reach kvcached at %s: %s\n"
                 "  is kvcached running there? set the address with --target=host:port\n"
                 "  (TLS: does it serve TLS, and does its certificate chain to --tls_ca and name\n"
                 "  the target or --tls_server_name?)\n",
                 target.c_str(), status.error_message().c_str());
    return 2;
  }
  // gRPC and Abseil number their codes alike; the name is what a person can look up.
  std::fprintf(stderr, "kvcachectl: %s: %s\n",
               absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
               status.error_message().c_str());
  return 3;
}

void PrintPools(const pb::ListPoolsResponse& response) {
  Table table({"POOL", "DEVICE", "LAYERS", "KV_HEADS", "Q_HEADS", "HEAD_DIM", "DTYPE", "BLOCK",
               "CAPACITY", "USED", "FREE_BLOCKS", "SEQUENCES"});
  for (const auto& p : response.pools()) {
    const auto& g = p.geometry();
    table.AddRow(
        {p.name(), p.device(), absl::StrCat(g.num_layers()), absl::StrCat(g.num_kv_heads()),
         absl::StrCat(g.num_query_heads()), absl::StrCat(g.head_dim()), DTypeName(g.dtype()),
         absl::StrCat(g.block_tokens(), " tok/", FormatBytes(p.block_bytes())),
         FormatBytes(p.capacity_bytes()), FormatBytes(p.used_bytes()),
         absl::StrCat(p.free_blocks(), "/", p.total_blocks()), absl::StrCat(p.sequences())});
  }
  std::cout << table.Render();
}

void PrintSequences(const pb::ListSequencesResponse& response) {
  Table table(
      {"SEQUENCE", "POOL", "TENANT", "TOKENS", "STORED_TOKEN_HEADS", "BYTES", "RATIO", "FORMATS"});
  for (const auto& s : response.sequences()) {
    std::string formats;
    for (const auto& fb : s.bytes_by_format()) {
      absl::StrAppend(&formats, formats.empty() ? "" : ",", FormatName(fb.format()));
    }
    table.AddRow({s.sequence_id(), s.pool(), s.tenant().empty() ? "-" : s.tenant(),
                  absl::StrCat(s.visible_tokens()), absl::StrCat(s.stored_token_heads()),
                  FormatBytes(s.bytes()), absl::StrFormat("%.2f", s.compression_ratio()),
                  formats.empty() ? "-" : formats});
  }
  std::cout << table.Render();
  if (response.total() > response.sequences_size()) {
    std::cout << "(" << response.sequences_size() << " of " << response.total()
              << " sequences shown; raise --limit)\n";
  }
}

void SortSequences(pb::ListSequencesResponse* response, const std::string& by) {
  auto* list = response->mutable_sequences();
  std::stable_sort(list->begin(), list->end(),
                   [&](const pb::SequenceInfo& a, const pb::SequenceInfo& b) {
                     if (by == "tokens") return a.visible_tokens() > b.visible_tokens();
                     if (by == "bytes") return a.bytes() > b.bytes();
                     if (by == "id") return a.sequence_id() < b.sequence_id();
                     return a.created_unix_ms() < b.created_unix_ms();
                   });
}

void PrintSequence(const pb::SequenceInfo& s) {
  Table table({"FIELD", "VALUE"});
  table.AddRow({"sequence", s.sequence_id()});
  table.AddRow({"pool", s.pool()});
  table.AddRow({"tenant", s.tenant().empty() ? "-" : s.tenant()});
  table.AddRow({"visible tokens", absl::StrCat(s.visible_tokens())});
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t n : s.layer_tokens()) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  table.AddRow({"layer tokens",
                s.layer_tokens_size() == 0 ? "-"
                : lo == hi
                    ? absl::StrCat(lo, " in each of ", s.layer_tokens_size(), " layers")
                    : absl::StrCat(lo, "..", hi, " over ", s.layer_tokens_size(), " layers")});
  table.AddRow({"stored token-heads", absl::StrCat(s.stored_token_heads())});
  table.AddRow({"bytes", FormatBytes(s.bytes())});
  for (const auto& fb : s.bytes_by_format()) {
    table.AddRow({absl::StrCat("bytes ", FormatName(fb.format())),
                  absl::StrCat(FormatBytes(fb.bytes()), " in ", fb.blocks(), " blocks")});
  }
  table.AddRow({"compression ratio", absl::StrFormat("%.2f", s.compression_ratio())});
  table.AddRow({"created (unix ms)", absl::StrCat(s.created_unix_ms())});
  std::cout << table.Render();
}

// A quota as shown: "unlimited" for 0.
std::string Limit(int64_t value) { return value == 0 ? "unlimited" : absl::StrCat(value); }
std::string ByteLimit(int64_t value) { return value == 0 ? "unlimited" : FormatBytes(value); }

void PrintTenants(const pb::ListTenantsResponse& r) {
  Table table({"TENANT", "SEQUENCES", "BYTES", "STREAMS", "COMPUTE", "QUOTA BYTES/POOL",
               "QUOTA SEQS", "QUOTA STREAMS", "QUOTA COMPUTE"});
  for (const auto& t : r.tenants()) {
    std::vector<std::string> pools;
    for (const auto& [pool, bytes] : t.pool_bytes()) {
      if (bytes > 0) pools.push_back(absl::StrCat(pool, ":", FormatBytes(bytes)));
    }
    std::sort(pools.begin(), pools.end());
    table.AddRow({t.tenant().empty() ? "(none)" : t.tenant(), absl::StrCat(t.sequences()),
                  pools.empty() ? "0" : absl::StrJoin(pools, " "), absl::StrCat(t.open_streams()),
                  absl::StrCat(t.compute_calls()), ByteLimit(t.quota_bytes_per_pool()),
                  Limit(t.quota_sequences()), Limit(t.quota_streams()),
                  Limit(t.quota_compute_calls())});
  }
  std::cout << table.Render();
}

void PrintStats(const pb::PoolStats& s) {
  Table table({"FIELD", "VALUE"});
  table.AddRow({"pool", s.pool().empty() ? "(all)" : s.pool()});
  if (!s.tenant().empty()) {
    // A tenant's own view (authentication on, not an admin): its use and limits only.
    table.AddRow({"tenant", s.tenant()});
    table.AddRow({"quota bytes per pool", ByteLimit(s.quota_bytes())});
    table.AddRow({"quota sequences", Limit(s.quota_sequences())});
  }
  table.AddRow({"capacity", FormatBytes(s.capacity_bytes())});
  table.AddRow({"used", absl::StrFormat("%s (%.1f%%)", FormatBytes(s.used_bytes()),
                                        s.capacity_bytes() > 0
                                            ? 100.0 * static_cast<double>(s.used_bytes()) /
                                                  static_cast<double>(s.capacity_bytes())
                                            : 0.0)});
  table.AddRow({"free", FormatBytes(s.free_bytes())});
  table.AddRow({"blocks used/total", absl::StrCat(s.used_blocks(), "/", s.total_blocks())});
  table.AddRow({"sequences", absl::StrCat(s.sequences())});
  table.AddRow({"visible tokens", absl::StrCat(s.visible_tokens())});
  table.AddRow({"stored token-heads", absl::StrCat(s.stored_token_heads())});
  for (const auto& fb : s.bytes_by_format()) {
    table.AddRow({absl::StrCat("bytes ", FormatName(fb.format())),
                  absl::StrCat(FormatBytes(fb.bytes()), " in ", fb.blocks(), " blocks")});
  }
  table.AddRow({"appended (total)", FormatBytes(s.appended_bytes_total())});
  table.AddRow({"fetched (total)", FormatBytes(s.fetched_bytes_total())});
  std::cout << table.Render();
}

// ---- one kvcached ----------------------------------------------------------------------

// A channel to `target` with the security flags applied.
struct Conn {
  kvc::client::ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
};

absl::StatusOr<Conn> Dial(const std::string& target) {
  Conn conn;
  conn.options.target = target;
  if (absl::Status status = kvc::cli::ApplySecurityFlags(&conn.options); !status.ok()) {
    return status;
  }
  auto channel = kvc::client::internal::CreateChannel(conn.options);
  if (!channel.ok()) return channel.status();
  conn.channel = *std::move(channel);
  return conn;
}

void PrepareContext(const Conn& conn, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  kvc::client::internal::AddCallCredentials(conn.options, context);
}

bool ValidSort(const std::string& sort) {
  if (sort == "created" || sort == "tokens" || sort == "bytes" || sort == "id") return true;
  std::cerr << "kvcachectl: --sort=" << sort << " is not one of created, tokens, bytes, id\n";
  return false;
}

// The commands against one kvcached at `target` (with --target, or the shard a cluster
// command resolved).
int RunOne(const std::string& command, const std::vector<char*>& args, const std::string& target,
           bool json) {
  auto conn_or = Dial(target);
  if (!conn_or.ok()) {
    std::fprintf(stderr, "kvcachectl: %s\n", std::string(conn_or.status().message()).c_str());
    return 1;
  }
  const Conn conn = *std::move(conn_or);
  auto stub = pb::AdminService::NewStub(conn.channel);
  grpc::ClientContext context;
  PrepareContext(conn, &context);

  if (command == "pools") {
    pb::ListPoolsResponse response;
    const grpc::Status status = stub->ListPools(&context, pb::ListPoolsRequest(), &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      PrintPools(response);
    return 0;
  }
  if (command == "sequences") {
    const std::string sort = absl::GetFlag(FLAGS_sort);
    if (!ValidSort(sort)) return 2;
    pb::ListSequencesRequest request;
    request.set_pool(absl::GetFlag(FLAGS_pool));
    request.set_tenant(absl::GetFlag(FLAGS_tenant));
    request.set_limit(absl::GetFlag(FLAGS_limit));
    pb::ListSequencesResponse response;
    const grpc::Status status = stub->ListSequences(&context, request, &response);
    if (!status.ok()) return Report(status, target);
    SortSequences(&response, sort);
    if (json)
      std::cout << Json(response);
    else
      PrintSequences(response);
    return 0;
  }
  if (command == "stats") {
    pb::GetPoolStatsRequest request;
    request.set_pool(absl::GetFlag(FLAGS_pool));
    pb::PoolStats response;
    const grpc::Status status = stub->GetPoolStats(&context, request, &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      PrintStats(response);
    return 0;
  }
  if (command == "sequence") {
    auto kv = pb::KvCacheService::NewStub(conn.channel);
    pb::GetSequenceRequest request;
    request.set_sequence_id(args[3]);
    request.set_tenant(absl::GetFlag(FLAGS_tenant));
    pb::SequenceInfo response;
    const grpc::Status status = kv->GetSequence(&context, request, &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      PrintSequence(response);
    return 0;
  }
  if (command == "evict") {
    pb::EvictSequenceRequest request;
    request.set_sequence_id(args[2]);
    request.set_tenant(absl::GetFlag(FLAGS_tenant));
    pb::EvictSequenceResponse response;
    const grpc::Status status = stub->EvictSequence(&context, request, &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      std::cout << "evicted " << args[2] << ": freed " << response.freed_blocks() << " blocks ("
                << FormatBytes(response.freed_bytes()) << ")\n";
    return 0;
  }
  if (command == "tenants") {
    pb::ListTenantsResponse response;
    const grpc::Status status = stub->ListTenants(&context, pb::ListTenantsRequest(), &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      PrintTenants(response);
    return 0;
  }
  if (command == "drain") {
    pb::DrainRequest request;
    request.set_resume(absl::GetFlag(FLAGS_resume));
    pb::DrainResponse response;
    const grpc::Status status = stub->Drain(&context, request, &response);
    if (!status.ok()) return Report(status, target);
    if (json)
      std::cout << Json(response);
    else
      std::cout << (response.draining() ? "draining: no new sequences accepted; "
                                        : "accepting new sequences; ")
                << response.sequences() << " sequences held\n";
    return 0;
  }
  std::fprintf(stderr, "kvcachectl: unknown command '%s'\nusage: %s\n", command.c_str(), kUsage);
  return 1;
}

// ---- a cluster -------------------------------------------------------------------------

using kvc::client::ClusterClient;
using kvc::client::ShardState;
using kvc::client::ShardStatus;

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
      PrepareContext(*conn, &context);
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
               "STORED_TOKEN_HEADS", "APPENDED", "FETCHED"});
  auto add = [&](const std::string& shard, const pb::PoolStats& s) {
    table.AddRow({shard, s.pool().empty() ? "(all)" : s.pool(), FormatBytes(s.capacity_bytes()),
                  FormatBytes(s.used_bytes()), FormatBytes(s.free_bytes()),
                  absl::StrCat(s.used_blocks(), "/", s.total_blocks()), absl::StrCat(s.sequences()),
                  absl::StrCat(s.visible_tokens()), absl::StrCat(s.stored_token_heads()),
                  FormatBytes(s.appended_bytes_total()), FormatBytes(s.fetched_bytes_total())});
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
  for (const ShardStatus& s : shards) {
    known.push_back(
        absl::StrCat(s.shard.empty() ? "?" : s.shard, "@", s.address, " (", StateName(s), ")"));
  }
  std::fprintf(stderr, "kvcachectl: no shard named '%s' answers; shards: %s\n", name.c_str(),
               absl::StrJoin(known, ", ").c_str());
  return "";
}

int RunCluster(const std::string& command, const std::vector<char*>& args, bool json) {
  const std::string targets = absl::GetFlag(FLAGS_targets);
  const std::string dns = absl::GetFlag(FLAGS_dns);
  if (command == "drain" && absl::GetFlag(FLAGS_shard).empty()) {
    std::fprintf(stderr,
                 "kvcachectl: drain with --targets/--dns needs --shard=NAME: draining every "
                 "shard at once stops the cache (see `kvcachectl cluster` for the names)\n");
    return 1;
  }
  if (command == "tenants") {
    std::fprintf(stderr,
                 "kvcachectl: tenants is per kvcached; use --target=ADDRESS (see `kvcachectl "
                 "cluster` for the addresses)\n");
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
    std::fprintf(stderr, "kvcachectl: unknown command '%s'\nusage: %s\n", command.c_str(), kUsage);
    return 1;
  }
  const std::string address = AddressOfShard(shards, name);
  if (address.empty()) return 2;
  return RunOne(command, args, address, json);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "usage: %s\n", kUsage);
    return 1;
  }
  const std::string command = args[1];
  if (command == "hash-token") {
    if (args.size() != 2) {
      std::fprintf(stderr, "kvcachectl: hash-token takes no arguments\nusage: %s\n", kUsage);
      return 1;
    }
    return HashToken();
  }
  const size_t expected_args = command == "sequence" ? 4 : (command == "evict" ? 3 : 2);
  if (args.size() != expected_args || (command == "sequence" && std::string(args[2]) != "show")) {
    std::fprintf(stderr, "kvcachectl: wrong arguments for '%s'\nusage: %s\n", command.c_str(),
                 kUsage);
    return 1;
  }
  const bool json = absl::GetFlag(FLAGS_json);
  const bool has_targets = !absl::GetFlag(FLAGS_targets).empty();
  const bool has_dns = !absl::GetFlag(FLAGS_dns).empty();
  const absl::CommandLineFlag* target_flag = absl::FindCommandLineFlag("target");
  const bool has_target = target_flag->CurrentValue() != target_flag->DefaultValue();
  if (int(has_targets) + int(has_dns) + int(has_target) > 1) {
    std::fprintf(stderr, "kvcachectl: give one of --target, --targets, --dns\n");
    return 1;
  }
  if (has_targets || has_dns) return RunCluster(command, args, json);
  if (command == "cluster") {
    std::fprintf(stderr, "kvcachectl: cluster needs --targets=h:p,h:p or --dns=host:port\n");
    return 1;
  }
  return RunOne(command, args, absl::GetFlag(FLAGS_target), json);
}
