// Byte layout of one KV block: block_tokens tokens of ONE (layer, kv head).
// Plain C++17, host/device neutral (no CUDA types), shared by every backend and the service.
//
//   [ K records: block_tokens x token_record_bytes ]   key of token slot i at i * record
//   [ V records: block_tokens x token_record_bytes ]
//
// Each section starts on a 16-byte boundary. A block holds token records and nothing else:
// per-token bookkeeping (original position, accumulated attention score) is the caller's
// host-side metadata, passed to the ops that need it as plain arrays. So a block's bytes
// depend only on the keys and values written into it (a device pool, a zero-copy reader or
// a shared prefix sees nothing that changes when a token is attended to). A token record is
// self-contained: its packed elements followed by its own quantization scales, so moving or
// evicting one token never touches another. Record formats per StorageFormat are in
// docs/KERNELS.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/kernels/dtype.h"

namespace kvc::kernels {

constexpr size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Elements of head_dim per quantization group, or 0 for formats without groups.
constexpr int FormatGroupSize(StorageFormat format) {
  switch (format) {
    case StorageFormat::kInt4G32:
      return 32;
    case StorageFormat::kInt4G64:
      return 64;
    case StorageFormat::kNvfp4:
      return 16;
    default:
      return 0;
  }
}

// True when `format` can store tokens of `head_dim` elements (groups must tile head_dim).
constexpr bool FormatSupportsHeadDim(StorageFormat format, int head_dim) {
  if (head_dim <= 0 || head_dim % 16 != 0) return false;
  const int group = FormatGroupSize(format);
  return group == 0 || head_dim % group == 0;
}

// Bytes of one token's key (or value) record in `format`: packed elements, then scales.
// Always a multiple of 4 (for head_dim % 16 == 0), so every record's f32 scale is aligned
// when the block is. Field offsets inside a record: kvc/kernels/record_codec.h.
constexpr size_t TokenRecordBytes(StorageFormat format, int head_dim) {
  const size_t d = static_cast<size_t>(head_dim);
  switch (format) {
    case StorageFormat::kF32:
      return 4 * d;
    case StorageFormat::kF16:
    case StorageFormat::kBF16:
      return 2 * d;
    case StorageFormat::kFp8E4M3:
    case StorageFormat::kInt8:
      return d + 4;  // int8/e4m3 x d, f32 scale
    case StorageFormat::kInt4G32:
      return d / 2 + (d / 32) * 4;  // nibbles, (f16 scale, f16 zero)/group
    case StorageFormat::kInt4G64:
      return d / 2 + (d / 64) * 4;
    // e2m1 nibbles, one e4m3 scale per 16, padded to 4 bytes, then the f32 tensor scale.
    case StorageFormat::kNvfp4:
      return AlignUp(d / 2 + d / 16, 4) + 4;
  }
  return 0;
}

struct BlockLayout {
  StorageFormat format = StorageFormat::kF16;
  int head_dim = 0;
  int block_tokens = 0;
  size_t record_bytes = 0;  // bytes of one token's K (or V) record
  size_t key_offset = 0;    // byte offset of the K records
  size_t value_offset = 0;  // byte offset of the V records
  size_t block_bytes = 0;   // total bytes, a multiple of 64
};

constexpr BlockLayout MakeBlockLayout(StorageFormat format, int head_dim, int block_tokens) {
  BlockLayout l;
  l.format = format;
  l.head_dim = head_dim;
  l.block_tokens = block_tokens;
  l.record_bytes = TokenRecordBytes(format, head_dim);
  const size_t n = static_cast<size_t>(block_tokens);
  l.key_offset = 0;
  l.value_offset = AlignUp(l.key_offset + n * l.record_bytes, 16);
  l.block_bytes = AlignUp(l.value_offset + n * l.record_bytes, 64);
  return l;
}

static_assert(TokenRecordBytes(StorageFormat::kF16, 64) == 128, "f16 record");
static_assert(TokenRecordBytes(StorageFormat::kInt4G32, 128) == 64 + 16, "int4 g32 record");
static_assert(TokenRecordBytes(StorageFormat::kNvfp4, 128) == 64 + 8 + 4, "nvfp4 record");
static_assert(TokenRecordBytes(StorageFormat::kNvfp4, 16) == 12 + 4, "nvfp4 record, padded");
static_assert(TokenRecordBytes(StorageFormat::kFp8E4M3, 128) == 128 + 4, "fp8 record");
static_assert(TokenRecordBytes(StorageFormat::kInt4G64, 128) == 64 + 8, "int4 g64 record");
static_assert(MakeBlockLayout(StorageFormat::kF16, 64, 16).block_bytes == 2 * 16 * 128,
              "f16 block of 16 tokens x 64 dims: records only");

}  // namespace kvc::kernels
