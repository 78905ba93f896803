#include "cachesvc/core/pool/pool_options.h"

#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kvc/kernels/block_layout.h"

namespace kvc::cachesvc {

bool IsValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckFormatFits(const PoolOptions& options, StorageFormat format) {
  if (kernels::FormatSupportsHeadDim(format, options.geometry.head_dim)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("storage format ", kernels::StorageFormatName(format), " cannot store head_dim ",
                   options.geometry.head_dim, " (its groups must tile head_dim)"));
}

absl::Status PoolFullError(const PoolOptions& options, StorageFormat format, int64_t blocks,
                           int64_t block_bytes, int64_t free_bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "pool '", options.name, "' is full: this request needs ", blocks, " ",
      kernels::StorageFormatName(format), " blocks (", blocks * block_bytes, " bytes) but ",
      free_bytes, " of ", options.capacity_bytes,
      " bytes are free; release sequences, compress them, or give the pool more capacity_bytes"));
}

int64_t KeepFreeBytes(const PoolOptions& options) {
  return options.keep_free_bytes.value_or(std::min(options.capacity_bytes / 4, int64_t{1} << 30));
}

int64_t SegmentBytes(const PoolOptions& options, int64_t block_bytes) {
  constexpr int64_t kMin = int64_t{64} << 10, kMax = int64_t{32} << 20;
  int64_t target = options.segment_bytes.value_or(0);
  if (target == 0) {
    target = kMin;
    while (target < options.capacity_bytes / 256 && target < kMax) target *= 2;
  }
  const int64_t unit = std::lcm(block_bytes, static_cast<int64_t>(::sysconf(_SC_PAGESIZE)));
  return std::max(unit, target / unit * unit);
}

absl::StatusOr<int> ParsePoolDevice(const std::string& device) {
  if (device == "cpu") return -1;
  constexpr absl::string_view kCuda = "cuda:";
  const absl::string_view rest = absl::string_view(device).substr(
      absl::StartsWith(device, kCuda) ? kCuda.size() : device.size());
  int ordinal = -1;
  if (absl::StartsWith(device, kCuda) && !rest.empty() && rest.size() <= 3 &&
      std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
      absl::SimpleAtoi(rest, &ordinal)) {
    return ordinal;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device '", device.substr(0, 64), "' is not 'cpu' or 'cuda:N' (N a device ordinal)"));
}

absl::Status ValidatePoolOptions(const PoolOptions& o) {
  const std::string where = absl::StrCat("pool '", o.name, "': ");
  if (!IsValidName(o.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool name '", o.name, "' is invalid: use 1-128 characters from [A-Za-z0-9._:-]"));
  }
  if (absl::StatusOr<int> device = ParsePoolDevice(o.device); !device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, device.status().message()));
  }
  const PoolGeometry& g = o.geometry;
  if (g.num_layers < 1 || g.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_layers is ", g.num_layers, "; expected 1..", kMaxLayers));
  }
  if (g.num_kv_heads < 1 || g.num_kv_heads > kMaxKvHeads) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_kv_heads is ", g.num_kv_heads, "; expected 1..", kMaxKvHeads));
  }
  if (g.num_query_heads < g.num_kv_heads || g.num_query_heads % g.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "num_query_heads is ", g.num_query_heads,
                     "; expected a positive multiple of num_kv_heads (", g.num_kv_heads, ")"));
  }
  if (g.head_dim < 16 || g.head_dim > kMaxHeadDim || g.head_dim % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "head_dim is ", g.head_dim, "; expected a multiple of 16 in 16..", kMaxHeadDim));
  }
  if (g.block_tokens < 1 || g.block_tokens > kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "block_tokens is ", g.block_tokens, "; expected 1..", kMaxBlockTokens));
  }
  if (g.rope.enabled) {
    if (!(g.rope.theta > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rope.theta is ", g.rope.theta, "; expected > 0"));
    }
    if (g.rope.rotary_dim < 0 || g.rope.rotary_dim > g.head_dim || g.rope.rotary_dim % 2 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "rope.rotary_dim is ", g.rope.rotary_dim,
                       "; expected an even number in 0..head_dim (0 = head_dim)"));
    }
  }
  const auto layout =
      kernels::MakeBlockLayout(kernels::RawFormatFor(g.dtype), g.head_dim, g.block_tokens);
  if (o.keep_free_bytes.has_value() && *o.keep_free_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, "keep_free_bytes is ", *o.keep_free_bytes,
                                                   "; expected >= 0 (0 = keep no free pages)"));
  }
  if (o.capacity_bytes < static_cast<int64_t>(layout.block_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(where, "capacity_bytes is ", o.capacity_bytes,
                                                   "; expected at least one block (",
                                                   layout.block_bytes, " bytes)"));
  }
  if (o.segment_bytes.has_value()) {
    // Each format's arena is ~2 x capacity / segment_bytes segments of host metadata and, in
    // use, one descriptor each: keep that bounded.
    constexpr int64_t kMinSegment = int64_t{64} << 10, kMaxSegment = int64_t{1} << 30;
    const int64_t at_least = std::max(kMinSegment, o.capacity_bytes >> 16);
    if (*o.segment_bytes < at_least || *o.segment_bytes > kMaxSegment) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "segment_bytes is ", *o.segment_bytes, "; expected ", at_least,
                       " .. ", kMaxSegment, " (at least 64 KiB and capacity_bytes / 65536)"));
    }
  }
  if (!o.tenant.empty() && o.tenant.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(where, "tenant is longer than 128 bytes"));
  }
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
