// Validation of pool options, shared by the config loader and pool constructors.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/types.h"

namespace kvc::cachesvc {

// Limits that keep every size computation far from overflow.
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxKvHeads = 1024;
inline constexpr int kMaxHeadDim = 512;
inline constexpr int kMaxBlockTokens = 1024;

// INVALID_ARGUMENT naming the field and the accepted range when options cannot form a pool.
absl::Status ValidatePoolOptions(const PoolOptions& options);

// PoolOptions::keep_free_bytes, or its default: a quarter of capacity_bytes, at most 1 GiB.
int64_t KeepFreeBytes(const PoolOptions& options);

// The segment size of a host pool's arena whose blocks are `block_bytes` long:
// PoolOptions::segment_bytes (or its default) rounded down to a multiple of both block_bytes
// and the page size, at least one of each.
int64_t SegmentBytes(const PoolOptions& options, int64_t block_bytes);

// The CUDA device ordinal of a pool's `device` ("cuda:N" -> N), -1 for "cpu", or
// INVALID_ARGUMENT for anything else.
absl::StatusOr<int> ParsePoolDevice(const std::string& device);

// The refusals every BlockPool shares: INVALID_ARGUMENT when `format` cannot store the pool's
// head_dim; RESOURCE_EXHAUSTED naming the pool, the need and what is free.
absl::Status CheckFormatFits(const PoolOptions& options, StorageFormat format);
absl::Status PoolFullError(const PoolOptions& options, StorageFormat format, int64_t blocks,
                           int64_t block_bytes, int64_t free_bytes);

// True for names made of [A-Za-z0-9._:-], 1..128 bytes (pool names, client sequence ids).
bool IsValidName(const std::string& name);

}  // namespace kvc::cachesvc
