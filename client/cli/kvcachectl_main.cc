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
// Human tables by default; --json prints the kvcache.v1 response as JSON for scripts.
// TLS and the bearer token: --tls_ca, --tls_cert, --tls_key, --tls_server_name, --token_file
// (or $KVC_TOKEN); see client/cli/security_flags.h.
// Exit codes: 0 ok, 1 usage error, 2 target unreachable, 3 the server refused the call.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/channel/channel.h"
#include "client/cli/hash_token.h"
#include "client/cli/security_flags.h"
#include "client/cli/table.h"
#include "google/protobuf/util/json_util.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "kvcached address (host:port or unix:/path)");
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
    "kvcachectl [--target=host:port] [--json] <command>\n"
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
  const std::string target = absl::GetFlag(FLAGS_target);
  const bool json = absl::GetFlag(FLAGS_json);
  kvc::client::ClientOptions options;
  options.target = target;
  absl::Status options_status = kvc::cli::ApplySecurityFlags(&options);
  auto channel_or = options_status.ok()
                        ? kvc::client::internal::CreateChannel(options)
                        : absl::StatusOr<std::shared_ptr<grpc::Channel>>(std::move(options_status));
  if (!channel_or.ok()) {
    std::fprintf(stderr, "kvcachectl: %s\n", std::string(channel_or.status().message()).c_str());
    return 1;
  }
  const std::shared_ptr<grpc::Channel> channel = *std::move(channel_or);
  auto stub = pb::AdminService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  kvc::client::internal::AddCallCredentials(options, &context);

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
    if (sort != "created" && sort != "tokens" && sort != "bytes" && sort != "id") {
      std::cerr << "kvcachectl: --sort=" << sort << " is not one of created, tokens, bytes, id\n";
      return 2;
    }
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
    auto kv = pb::KvCacheService::NewStub(channel);
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
