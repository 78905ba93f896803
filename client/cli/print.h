// kvcachectl's output for one kvcached: the human tables of each response, the JSON form
// scripts read (--json), and the message for a call that failed. The cluster commands reuse
// the JSON and the names so a shard's answer reads the same as a single server's.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "google/protobuf/message.h"
#include "kvcache/v1/admin_service.pb.h"
#include "kvcache/v1/types.pb.h"

namespace kvc::cli {

// The kvcache.v1 message as indented JSON with every field (zeros too) under its proto name:
// scripts then see the same keys whatever the values.
std::string Json(const google::protobuf::Message& message);

// "f32", "f16", "bf16" ("?" for anything else).
const char* DTypeName(::kvcache::v1::DType dtype);

// STORAGE_FORMAT_DENSE -> "dense".
std::string FormatName(::kvcache::v1::StorageFormat format);

// Prints why the call to `target` failed on stderr and returns the exit code: 2 when
// kvcached could not be reached (with hints), 3 when it refused the call.
int Report(const grpc::Status& status, const std::string& target);

void PrintPools(const ::kvcache::v1::ListPoolsResponse& response);
void PrintSequences(const ::kvcache::v1::ListSequencesResponse& response);
void PrintSequence(const ::kvcache::v1::SequenceInfo& s);
void PrintTenants(const ::kvcache::v1::ListTenantsResponse& r);
// One row per lease; times relative to `now_unix_ms` (expires in, age).
void PrintLeases(const ::kvcache::v1::ListLeasesResponse& r, int64_t now_unix_ms);

// Pool statistics as FIELD/VALUE rows; the prefix cache's rows only when the server sent them
// (pool-wide statistics: a tenant's own view has none).
void PrintStats(const ::kvcache::v1::PoolStats& s);

// The prefix cache's token hit rate with its denominator: "60.0% (576 of 960 tokens)", or
// "- (0 of 0 tokens)" before any lookup.
std::string PrefixHitRate(const ::kvcache::v1::PrefixCacheStats& c);

// Orders the sequences by `by` (created | tokens | bytes | id; largest first for tokens and
// bytes); stable, so equal keys keep the server's order.
void SortSequences(::kvcache::v1::ListSequencesResponse* response, const std::string& by);

// Whether `sort` is a --sort value SortSequences knows; says which are on stderr when not.
bool ValidSort(const std::string& sort);

}  // namespace kvc::cli
