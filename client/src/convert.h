// kvcache.v1 messages <-> public client types. Private to the client library.
#pragma once

#include "absl/status/statusor.h"
#include "kvc/client/types.h"
#include "kvcache/v1/admin_service.pb.h"
#include "kvcache/v1/kvcache_service.pb.h"

namespace kvc::client::internal {

kvcache::v1::DType ToProto(DType dtype);
DType FromProto(kvcache::v1::DType dtype);
StorageFormat FromProto(kvcache::v1::StorageFormat format);
SequenceInfo FromProto(const kvcache::v1::SequenceInfo& info);
PoolInfo FromProto(const kvcache::v1::PoolInfo& info);
PoolStats FromProto(const kvcache::v1::PoolStats& stats);
ServerInfo FromProto(const kvcache::v1::ServerInfo& info);
TenantUsage FromProto(const kvcache::v1::TenantUsage& usage);
LeaseInfo FromProto(const kvcache::v1::LeaseInfo& lease);
CompressionSpec FromProto(const kvcache::v1::CompressionSpec& spec);
absl::StatusOr<Lease> FromProto(const kvcache::v1::Lease& lease);
void ToProto(const AppendChunk& chunk, kvcache::v1::AppendRequest* out);
void ToProto(const Prefix& prefix, kvcache::v1::PrefixSpec* out);
void ToProto(const CompressionSpec& spec, kvcache::v1::CompressionSpec* out);
void ToProto(const AttendRequest& request, kvcache::v1::AttendRequest* out);
// Moves the output out of `response`.
AttendResult FromProto(kvcache::v1::AttendResponse& response);
CompressResult FromProto(const kvcache::v1::CompressResponse& response);
// Moves the payload out of `chunk`.
FetchedChunk FromProto(kvcache::v1::FetchChunk& chunk);

}  // namespace kvc::client::internal
