// kvcachectl's --json: the client library's admin types (kvc::client::AdminClient's answers)
// as the JSON of the kvcache.v1 responses they came from: every field under its proto name,
// zeros too, int64 as strings and enums by their proto names, as protobuf's JSON printer wrote
// them (tests/client/admin_json_test.cc holds the two side by side). Scripts see the same keys
// whatever the values.
#pragma once

#include <cstdint>
#include <vector>

#include "client/cli/json.h"
#include "kvc/client/types.h"

namespace kvc::cli {

// kvcache.v1 enum names: STORAGE_FORMAT_F16, DTYPE_BF16.
const char* StorageFormatProtoName(client::StorageFormat format);
const char* DTypeProtoName(client::DType dtype);

Json JsonOf(const client::PoolInfo& pool);
Json JsonOf(const client::PoolStats& stats);                   // PoolStats
Json JsonOf(const client::SequenceInfo& sequence);             // SequenceInfo
Json JsonOf(const client::CompressionSpec& spec);              // CompressionSpec
Json JsonOf(const client::TenantUsage& usage);                 // TenantUsage
Json JsonOf(const client::LeaseInfo& lease);                   // LeaseInfo
Json JsonOf(const client::ServerInfo& info);                   // ServerInfo
Json JsonOf(const client::EvictResult& result);                // EvictSequenceResponse
Json JsonOf(const client::DrainResult& result);                // DrainResponse
Json JsonOf(const client::SequenceList& list);                 // ListSequencesResponse
Json JsonOf(const std::vector<client::PoolInfo>& pools);       // ListPoolsResponse
Json JsonOf(const std::vector<client::TenantUsage>& tenants);  // ListTenantsResponse
Json JsonOf(const std::vector<client::LeaseInfo>& leases);     // ListLeasesResponse
Json EndLeaseJson(int64_t freed_blocks);                       // EndLeaseResponse

}  // namespace kvc::cli
