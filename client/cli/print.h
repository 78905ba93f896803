// kvcachectl's output for one kvcached: the human tables of each answer of
// kvc::client::AdminClient, and the message for a call that failed. --json is admin_json.h.
// The cluster commands reuse the names so a shard's answer reads the same as a single
// server's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvc/client/types.h"

namespace kvc::cli {

// "f32", "f16", "bf16" ("?" for anything else).
const char* DTypeLabel(client::DType dtype);

// StorageFormat::kF16 -> "f16" (the kvcache.v1 name, lower case, without STORAGE_FORMAT_).
std::string FormatName(client::StorageFormat format);

// Prints why the call to `target` failed on stderr and returns the exit code: 2 when
// kvcached could not be reached (UNAVAILABLE or DEADLINE_EXCEEDED, with hints), 3 when it
// refused the call.
int Report(const absl::Status& status, const std::string& target);

void PrintPools(const std::vector<client::PoolInfo>& pools);
void PrintSequences(const client::SequenceList& list);
void PrintSequence(const client::SequenceInfo& s);
void PrintTenants(const std::vector<client::TenantUsage>& tenants);
// One row per lease; times relative to `now_unix_ms` (expires in, age).
void PrintLeases(const std::vector<client::LeaseInfo>& leases, int64_t now_unix_ms);

// Pool statistics as FIELD/VALUE rows; the prefix cache's rows only when the server sent them
// (pool-wide statistics: a tenant's own view has none).
void PrintStats(const client::PoolStats& s);

// The prefix cache's token hit rate with its denominator: "60.0% (576 of 960 tokens)", or
// "- (0 of 0 tokens)" before any lookup.
std::string PrefixHitRate(const client::PoolStats::PrefixCache& c);

// Orders the sequences by `by` (created | tokens | bytes | id; largest first for tokens and
// bytes); stable, so equal keys keep the server's order.
void SortSequences(std::vector<client::SequenceInfo>* sequences, const std::string& by);

// Whether `sort` is a --sort value SortSequences knows; says which are on stderr when not.
bool ValidSort(const std::string& sort);

}  // namespace kvc::cli
