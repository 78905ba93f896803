// kvcachectl: inspect a running kvcached.
//
//   kvcachectl [--target=host:port] [--json] pools
//   kvcachectl [--target=host:port] [--json] sequences [--pool=P] [--tenant=T] [--limit=N]
//   kvcachectl [--target=host:port] [--json] stats [--pool=P]
//   kvcachectl [--target=host:port] [--json] sequence show ID
//   kvcachectl [--target=host:port] evict ID
//   kvcachectl [--target=host:port] [--json] leases [--tenant=T] [--pool=P]
//   kvcachectl [--target=host:port] end-lease TENANT LEASE_ID
//   kvcachectl [--target=host:port] drain [--resume]
//   kvcachectl hash-token --tenant=T [--role=tenant|admin] [--generate] < token
//
// A cluster instead of one kvcached: --targets=host:port,host:port or --dns=host:port (every
// address of the name; a Kubernetes headless Service), exclusive with --target. Then pools,
// stats and sequences ask every shard and print a SHARD column plus a total; `cluster` lists
// the shards; evict and sequence show go to the shard the id names; drain needs --shard=NAME.
// A shard that does not answer is listed with its error and the exit code is non-zero.
//
// Human tables by default; --json prints the answer as JSON for scripts, with the keys and
// value forms of the kvcache.v1 response (client/cli/admin_json.h).
// TLS and the bearer token: --tls_ca, --tls_cert, --tls_key, --tls_server_name, --token_file
// (or $KVC_TOKEN); see client/cli/security_flags.h.
// Exit codes: 0 ok, 1 usage error, 2 target unreachable, 3 the server refused the call.
//
// Every call goes through kvc::client::AdminClient. The pieces: print.h (tables),
// admin_json.h (--json), conn.h (an AdminClient with the security flags),
// cluster_commands.h (--targets/--dns); this file holds the flags and the commands against
// one kvcached.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/admin_json.h"
#include "client/cli/cluster_commands.h"
#include "client/cli/conn.h"
#include "client/cli/flags.h"
#include "client/cli/hash_token.h"
#include "client/cli/print.h"
#include "client/cli/table.h"
#include "kvc/client/admin_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "kvcached address (host:port or unix:/path)");
ABSL_FLAG(std::string, targets, "",
          "a cluster: comma-separated kvcached shard addresses (instead of --target)");
ABSL_FLAG(std::string, dns, "",
          "a cluster: host:port whose every DNS address is a shard (instead of --target)");
ABSL_FLAG(std::string, shard, "", "drain with --targets/--dns: the shard (by name) to drain");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(std::string, pool, "", "only this pool (sequences, stats, leases)");
ABSL_FLAG(std::string, tenant, "",
          "only this tenant (sequences, leases); the tenant whose sequence it is (sequence show, "
          "evict: an admin acting on another tenant's); the token's tenant (hash-token)");
ABSL_FLAG(int32_t, limit, 0, "at most this many sequences (0 = server default, 1000)");
ABSL_FLAG(std::string, page_token, "",
          "sequences: the page after the one that printed this token (its next_page_token)");
ABSL_FLAG(int32_t, timeout_ms, 5000, "deadline of the call");
ABSL_FLAG(std::string, sort, "created",
          "sequences: order by created | tokens | bytes | id (largest first for tokens, bytes)");
ABSL_FLAG(bool, resume, false, "drain: accept new sequences again");
ABSL_FLAG(std::string, role, "tenant", "hash-token: the token's role, tenant or admin");
ABSL_FLAG(bool, generate, false,
          "hash-token: make a random 32-byte token and print it (hex) instead of reading stdin");

namespace {

using kvc::cli::Call;
using kvc::cli::Dial;
using kvc::cli::EndLeaseJson;
using kvc::cli::FormatBytes;
using kvc::cli::JsonOf;
using kvc::cli::PrintLeases;
using kvc::cli::PrintPools;
using kvc::cli::PrintSequence;
using kvc::cli::PrintSequences;
using kvc::cli::PrintStats;
using kvc::cli::PrintTenants;
using kvc::cli::Report;
using kvc::cli::SortSequences;
using kvc::cli::ValidSort;

constexpr char kUsage[] =
    "kvcachectl [--target=host:port | --targets=h:p,h:p | --dns=host:port] [--json] <command>\n"
    "commands:\n"
    "  pools                                   pools, geometry and usage\n"
    "  sequences [--pool=P] [--tenant=T] [--limit=N]   live sequences\n"
    "  stats [--pool=P]                        usage summed over pools (or one pool)\n"
    "  sequence show ID [--tenant=T]           one sequence: lengths per layer, bytes\n"
    "  evict ID [--tenant=T]                   free a sequence (counted as evicted; admin)\n"
    "  tenants                                 what each tenant holds, its open calls, quotas\n"
    "  leases [--tenant=T] [--pool=P]          live leases: bytes, bytes only the lease pins,\n"
    "                                          age, expiry (a tenant sees its own)\n"
    "  end-lease TENANT LEASE_ID               end any tenant's lease at once (admin)\n"
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

// ---- one kvcached ----------------------------------------------------------------------

// The commands against one kvcached at `target` (with --target, or the shard a cluster
// command resolved).
int RunOne(const std::string& command, const std::vector<char*>& args, const std::string& target,
           bool json) {
  auto admin_or = Dial(target);
  if (!admin_or.ok()) {
    std::fprintf(stderr, "kvcachectl: %s\n", std::string(admin_or.status().message()).c_str());
    return 1;
  }
  const kvc::client::AdminClient& admin = **admin_or;
  const kvc::client::CallOptions call = Call();

  if (command == "pools") {
    auto pools = admin.ListPools(call);
    if (!pools.ok()) return Report(pools.status(), target);
    if (json)
      std::cout << JsonOf(*pools).Render();
    else
      PrintPools(*pools);
    return 0;
  }
  if (command == "sequences") {
    const std::string sort = absl::GetFlag(FLAGS_sort);
    if (!ValidSort(sort)) return 2;
    kvc::client::ListSequencesOptions options;
    options.pool = absl::GetFlag(FLAGS_pool);
    options.tenant = absl::GetFlag(FLAGS_tenant);
    options.limit = absl::GetFlag(FLAGS_limit);
    options.page_token = absl::GetFlag(FLAGS_page_token);
    auto list = admin.ListSequences(options, call);
    if (!list.ok()) return Report(list.status(), target);
    SortSequences(&list->sequences, sort);
    if (json)
      std::cout << JsonOf(*list).Render();
    else
      PrintSequences(*list);
    return 0;
  }
  if (command == "stats") {
    auto stats = admin.GetPoolStats(absl::GetFlag(FLAGS_pool), call);
    if (!stats.ok()) return Report(stats.status(), target);
    if (json)
      std::cout << JsonOf(*stats).Render();
    else
      PrintStats(*stats);
    return 0;
  }
  if (command == "sequence") {
    auto sequence = admin.GetSequence(args[3], absl::GetFlag(FLAGS_tenant), call);
    if (!sequence.ok()) return Report(sequence.status(), target);
    if (json)
      std::cout << JsonOf(*sequence).Render();
    else
      PrintSequence(*sequence);
    return 0;
  }
  if (command == "evict") {
    auto evicted = admin.EvictSequence(args[2], absl::GetFlag(FLAGS_tenant), call);
    if (!evicted.ok()) return Report(evicted.status(), target);
    if (json)
      std::cout << JsonOf(*evicted).Render();
    else
      std::cout << "evicted " << args[2] << ": freed " << evicted->freed_blocks << " blocks ("
                << FormatBytes(evicted->freed_bytes) << ")\n";
    return 0;
  }
  if (command == "tenants") {
    auto tenants = admin.ListTenants(call);
    if (!tenants.ok()) return Report(tenants.status(), target);
    if (json)
      std::cout << JsonOf(*tenants).Render();
    else
      PrintTenants(*tenants);
    return 0;
  }
  if (command == "leases") {
    auto leases = admin.ListLeases(absl::GetFlag(FLAGS_tenant), absl::GetFlag(FLAGS_pool), call);
    if (!leases.ok()) return Report(leases.status(), target);
    if (json)
      std::cout << JsonOf(*leases).Render();
    else
      PrintLeases(*leases, absl::ToUnixMillis(absl::Now()));
    return 0;
  }
  if (command == "end-lease") {
    auto freed = admin.EndLease(args[2], args[3], call);
    if (!freed.ok()) return Report(freed.status(), target);
    if (json)
      std::cout << EndLeaseJson(*freed).Render();
    else
      std::cout << "ended lease " << args[3] << " of tenant " << args[2] << ": " << *freed
                << " blocks went back to the pool\n";
    return 0;
  }
  if (command == "drain") {
    auto drained = admin.Drain(absl::GetFlag(FLAGS_resume), call);
    if (!drained.ok()) return Report(drained.status(), target);
    if (json)
      std::cout << JsonOf(*drained).Render();
    else
      std::cout << (drained->draining ? "draining: no new sequences accepted; "
                                      : "accepting new sequences; ")
                << drained->sequences << " sequences held\n";
    return 0;
  }
  std::fprintf(stderr, "kvcachectl: unknown command '%s'\nusage: %s\n", command.c_str(), kUsage);
  return 1;
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
  const size_t expected_args =
      command == "sequence" || command == "end-lease" ? 4 : (command == "evict" ? 3 : 2);
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
  if (has_targets || has_dns) {
    return kvc::cli::RunCluster(command, args, json, kUsage, [&](const std::string& address) {
      return RunOne(command, args, address, json);
    });
  }
  if (command == "cluster") {
    std::fprintf(stderr, "kvcachectl: cluster needs --targets=h:p,h:p or --dns=host:port\n");
    return 1;
  }
  return RunOne(command, args, absl::GetFlag(FLAGS_target), json);
}
