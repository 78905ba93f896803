// kvcachectl against a cluster (--targets=h:p,h:p or --dns=host:port) instead of one
// kvcached: pools, stats and sequences ask every shard and print a SHARD column and a total
// ({"shards": [...], "total": ...} with --json); `cluster` lists the shards; evict and
// sequence show go to the shard the id names, drain to --shard=NAME. A shard that does not
// answer is listed with its error and makes the exit code non-zero.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kvc::cli {

// Runs `command` (args as main parsed them: args[1] is the command, args[2] onwards its
// operands) on the cluster the --targets or --dns flag names; returns the exit code.
// Commands for one shard are handed to `run_on_shard` with the shard's address: they are the
// single-server commands, and print exactly what they print with --target. `usage` is
// printed after an unknown command.
int RunCluster(const std::string& command, const std::vector<char*>& args, bool json,
               const char* usage,
               const std::function<int(const std::string& address)>& run_on_shard);

}  // namespace kvc::cli
