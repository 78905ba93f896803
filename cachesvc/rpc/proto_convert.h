// The one place that knows both the kvcache.v1 messages and the core types.
#pragma once

#include "absl/status/statusor.h"
#include "cachesvc/core/store/kv_store.h"
#include "kvcache/v1/admin_service.pb.h"
#include "kvcache/v1/config.pb.h"
#include "kvcache/v1/kvcache_service.pb.h"

namespace kvc::cachesvc {

// INVALID_ARGUMENT naming `field` for values outside the enum.
absl::StatusOr<DType> FromProto(kvcache::v1::DType dtype, const char* field);
kvcache::v1::DType ToProto(DType dtype);
absl::StatusOr<StorageFormat> FromProto(kvcache::v1::StorageFormat format, const char* field);
kvcache::v1::StorageFormat ToProto(StorageFormat format);

absl::StatusOr<CompressionSpec> FromProto(const kvcache::v1::CompressionSpec& spec);
void ToProto(const CompressionSpec& spec, kvcache::v1::CompressionSpec* out);
// DTYPE_UNSPECIFIED leaves a dtype unset (the pool's; the core resolves it). Payloads are
// borrowed.
absl::StatusOr<CompressParams> FromProto(const kvcache::v1::CompressRequest& request);
void ToProto(const CompressResult& result, kvcache::v1::CompressResponse* out);
absl::StatusOr<AttendParams> FromProto(const kvcache::v1::AttendRequest& request);
// Moves the output buffer into the message.
void ToProto(AttendResult& result, int layer, kvcache::v1::AttendResponse* out);
// Fills defaults (block_tokens 16, dtype f16) for zero fields; validation is the pool's.
absl::StatusOr<PoolOptions> FromProto(const kvcache::v1::PoolConfig& config);
void ToProto(const PoolGeometry& geometry, kvcache::v1::PoolGeometry* out);

void ToProto(const SequenceSnapshot& snapshot, kvcache::v1::SequenceInfo* out);
void ToProto(const PoolSnapshot& snapshot, kvcache::v1::PoolInfo* out);
void ToProto(const PoolStatsSnapshot& stats, kvcache::v1::PoolStats* out);
PrefixSpec FromProto(const kvcache::v1::PrefixSpec& prefix);
// The scope is the caller's: set by the handler.
LeaseParams FromProto(const kvcache::v1::LeaseRequest& request);
void ToProto(const LeaseSnapshot& lease, kvcache::v1::Lease* out);
void ToProto(const LeaseInfo& lease, kvcache::v1::LeaseInfo* out);

absl::StatusOr<AppendParams> FromProto(const kvcache::v1::AppendRequest& request);
absl::StatusOr<FetchParams> FromProto(const kvcache::v1::FetchRequest& request);
// Moves the chunk's buffers into the message (no copy of the payload).
void ToProto(FetchChunk& chunk, kvcache::v1::FetchChunk* out);

}  // namespace kvc::cachesvc
