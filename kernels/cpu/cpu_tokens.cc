// CPU write/read/gather/re-rotation: rows are independent, so they are split across threads.
#include <algorithm>
#include <cstring>

#include "base/validate.h"
#include "cpu/avx512_codec.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_rows.h"
#include "kvc/kernels/record_codec.h"
#include "kvc/kernels/rope.h"
#include "kvc/kernels/xxh64.h"

namespace kvc::kernels::cpu {
namespace {
constexpr int64_t kRowGrain = 64;

// A chunk handed to another thread costs a wake-up (several microseconds on a loaded host):
// copies, which move ~10 GB/s, are worth splitting only in pieces this large. An Append of one
// lane (256 Llama-3 tokens = 128 KiB) then runs on its handler's thread, and the server's
// other cores serve the other requests in flight instead of waiting on hand-offs.
constexpr size_t kCopyChunkBytes = size_t{256} << 10;

// Rows per chunk of a write or read: codec rows (quantize / dequantize) are compute-bound and
// split at kRowGrain; raw rows are copies and split at kCopyChunkBytes.
int64_t TokenRowGrain(const BlockLayout& l, DType dtype) {
  if (l.format != RawFormatFor(dtype)) return kRowGrain;
  const size_t row_bytes = std::max<size_t>(1, 2 * l.record_bytes);  // key + value records
  return std::max<int64_t>(kRowGrain, static_cast<int64_t>(kCopyChunkBytes / row_bytes));
}
}  // namespace

// Rows [begin, end) of a write; instantiated per instruction set (see cpu_rows.h).
template <bool kFast>
KVC_CPU_INLINE void WriteRowsT(const WriteTokensArgs& a, int64_t begin, int64_t end) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int64_t stride = internal::RowStride(a.row_stride, d);
  const bool raw_copy = l.format == RawFormatFor(a.dtype);
  alignas(64) float x[kMaxHeadDim];
  for (int64_t r = begin; r < end; ++r) {
    const int32_t b = a.dst_blocks[r], s = a.dst_slots[r];
    const size_t off = static_cast<size_t>(r * stride);
    if (raw_copy) {  // same element type: the record is the row's bytes
      const size_t bytes = off * DTypeSize(a.dtype);
      std::memcpy(KeyRecord(a.arena, b, s), static_cast<const uint8_t*>(a.keys) + bytes,
                  l.record_bytes);
      std::memcpy(ValueRecord(a.arena, b, s), static_cast<const uint8_t*>(a.values) + bytes,
                  l.record_bytes);
    } else {
      LoadRow<kFast>(a.keys, a.dtype, off, d, x);
      QuantizeRecord(l.format, d, x, KeyRecord(a.arena, b, s));
      LoadRow<kFast>(a.values, a.dtype, off, d, x);
      QuantizeRecord(l.format, d, x, ValueRecord(a.arena, b, s));
    }
  }
}

template <bool kFast>
KVC_CPU_INLINE void ReadRowsT(const ReadTokensArgs& a, int64_t begin, int64_t end) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int64_t stride = internal::RowStride(a.row_stride, d);
  const bool raw_copy = l.format == RawFormatFor(a.dtype);
  alignas(64) float x[kMaxHeadDim];
  for (int64_t r = begin; r < end; ++r) {
    const int32_t b = a.src_blocks[r], s = a.src_slots[r];
    const size_t off = static_cast<size_t>(r * stride);
    for (int which = 0; which < 2; ++which) {
      void* dst = which == 0 ? a.keys : a.values;
      if (dst == nullptr) continue;
      const uint8_t* rec = which == 0 ? KeyRecord(a.arena, b, s) : ValueRecord(a.arena, b, s);
      if (raw_copy) {
        std::memcpy(static_cast<uint8_t*>(dst) + off * DTypeSize(a.dtype), rec, l.record_bytes);
      } else {
        DequantizeRecord(l.format, d, rec, x);
        StoreRow<kFast>(x, d, dst, a.dtype, off);
      }
    }
  }
}

#if defined(KVC_CPU_DISPATCH)
KVC_CPU_TARGET_FAST void WriteRowsFast(const WriteTokensArgs& a, int64_t begin, int64_t end) {
  WriteRowsT<true>(a, begin, end);
}
KVC_CPU_TARGET_FAST void ReadRowsFast(const ReadTokensArgs& a, int64_t begin, int64_t end) {
  ReadRowsT<true>(a, begin, end);
}

// The codec's arithmetic per row is long enough that out-of-order execution does not reach
// the next rows' cache misses by itself: touch the input rows and destination records a few
// rows ahead.
constexpr int64_t kPrefetchRows = 4;
KVC_CPU_INLINE void PrefetchWriteRow(const WriteTokensArgs& a, int64_t r, int64_t stride,
                                     size_t row_bytes) {
  const size_t off = static_cast<size_t>(r * stride) * DTypeSize(a.dtype);
  for (size_t i = 0; i < row_bytes; i += 64) {
    __builtin_prefetch(static_cast<const uint8_t*>(a.keys) + off + i);
    __builtin_prefetch(static_cast<const uint8_t*>(a.values) + off + i);
  }
  const int32_t b = a.dst_blocks[r], s = a.dst_slots[r];
  const size_t rec = a.arena.layout.record_bytes;
  for (size_t i = 0; i < rec; i += 64) {
    __builtin_prefetch(KeyRecord(a.arena, b, s) + i, 1);
    __builtin_prefetch(ValueRecord(a.arena, b, s) + i, 1);
  }
}

// AVX-512 instances: same structure, the record codec of avx512_codec.h (same bytes).
KVC_AVX512_TARGET void WriteRowsAvx512(const WriteTokensArgs& a, int64_t begin, int64_t end) {
  const BlockLayout& l = a.arena.layout;
  if (IsRawFormat(l.format)) return WriteRowsT<true>(a, begin, end);
  const int d = l.head_dim;
  const int64_t stride = internal::RowStride(a.row_stride, d);
  // Key and value rows of up to two tokens: x[2i] keys, x[2i + 1] values of token r + i.
  alignas(64) float rows_f32[4][kMaxHeadDim];
  const float* const x[4] = {rows_f32[0], rows_f32[1], rows_f32[2], rows_f32[3]};
  const bool pairs = avx512::QuantizesRowPairs(l.format);
  const size_t row_bytes = static_cast<size_t>(d) * DTypeSize(a.dtype);
  for (int64_t r = begin; r < end;) {
    const int n = pairs && r + 1 < end ? 2 : 1;
    uint8_t* rec[4];
    for (int i = 0; i < n; ++i) {
      const int64_t t = r + i;
      const int32_t b = a.dst_blocks[t], s = a.dst_slots[t];
      const size_t off = static_cast<size_t>(t * stride);
      if (t + kPrefetchRows < end) PrefetchWriteRow(a, t + kPrefetchRows, stride, row_bytes);
      avx512::LoadRow(a.keys, a.dtype, off, d, rows_f32[2 * i]);
      avx512::LoadRow(a.values, a.dtype, off, d, rows_f32[2 * i + 1]);
      rec[2 * i] = KeyRecord(a.arena, b, s);
      rec[2 * i + 1] = ValueRecord(a.arena, b, s);
    }
    if (n == 2) {
      avx512::QuantizeTwoRows(l.format, d, x, rec);
    } else {
      avx512::QuantizeRow(l.format, d, x, rec);
    }
    r += n;
  }
}

template <DType kOut, bool kStream>
KVC_AVX512_INLINE void ReadRowsAvx512T(const ReadTokensArgs& a, int64_t begin, int64_t end) {
  const BlockLayout& l = a.arena.layout;
  const int d = l.head_dim;
  const int64_t stride = internal::RowStride(a.row_stride, d);
  for (int64_t r = begin; r < end; ++r) {
    const int32_t b = a.src_blocks[r], s = a.src_slots[r];
    const size_t off = static_cast<size_t>(r * stride) * DTypeSize(kOut);
    if (r + kPrefetchRows < end) {
      const int32_t pb = a.src_blocks[r + kPrefetchRows], ps = a.src_slots[r + kPrefetchRows];
      for (size_t i = 0; i < l.record_bytes; i += 64) {
        __builtin_prefetch(KeyRecord(a.arena, pb, ps) + i);
        __builtin_prefetch(ValueRecord(a.arena, pb, ps) + i);
      }
    }
    if (a.keys != nullptr) {
      avx512::DequantizeRecord<kOut, kStream>(l.format, d, KeyRecord(a.arena, b, s),
                                              static_cast<uint8_t*>(a.keys) + off);
    }
    if (a.values != nullptr) {
      avx512::DequantizeRecord<kOut, kStream>(l.format, d, ValueRecord(a.arena, b, s),
                                              static_cast<uint8_t*>(a.values) + off);
    }
  }
}

// Reads larger than the caches stream their dense output past them (non-temporal stores):
// write-allocating it would read every output line before overwriting it.
constexpr size_t kStreamOutputBytes = size_t{8} << 20;
bool StreamOutput(const ReadTokensArgs& a) {
  const int64_t stride = internal::RowStride(a.row_stride, a.arena.layout.head_dim);
  const size_t row_bytes = static_cast<size_t>(stride) * DTypeSize(a.dtype);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
  return static_cast<size_t>(a.num_rows) * row_bytes >= kStreamOutputBytes && row_bytes % 64 == 0 &&
         aligned(a.keys) && aligned(a.values);
}

template <bool kStream>
KVC_AVX512_INLINE void ReadRowsAvx512D(const ReadTokensArgs& a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::kF32:
      return ReadRowsAvx512T<DType::kF32, kStream>(a, begin, end);
    case DType::kF16:
      return ReadRowsAvx512T<DType::kF16, kStream>(a, begin, end);
    case DType::kBF16:
      return ReadRowsAvx512T<DType::kBF16, kStream>(a, begin, end);
  }
}

KVC_AVX512_TARGET void ReadRowsAvx512(const ReadTokensArgs& a, int64_t begin, int64_t end) {
  if (IsRawFormat(a.arena.layout.format)) return ReadRowsT<true>(a, begin, end);
  if (!StreamOutput(a)) return ReadRowsAvx512D<false>(a, begin, end);
  ReadRowsAvx512D<true>(a, begin, end);
  _mm_sfence();  // streaming stores are weakly ordered: complete them before the pool joins
}
#endif

void WriteRows(const WriteTokensArgs& a, int64_t begin, int64_t end) {
#if defined(KVC_CPU_DISPATCH)
  switch (CpuIsaLevel()) {
    case CpuIsa::kAvx512:
      return WriteRowsAvx512(a, begin, end);
    case CpuIsa::kAvx2:
      return WriteRowsFast(a, begin, end);
    case CpuIsa::kBaseline:
      break;
  }
#endif
  WriteRowsT<false>(a, begin, end);
}

void ReadRows(const ReadTokensArgs& a, int64_t begin, int64_t end) {
#if defined(KVC_CPU_DISPATCH)
  switch (CpuIsaLevel()) {
    case CpuIsa::kAvx512:
      return ReadRowsAvx512(a, begin, end);
    case CpuIsa::kAvx2:
      return ReadRowsFast(a, begin, end);
    case CpuIsa::kBaseline:
      break;
  }
#endif
  ReadRowsT<false>(a, begin, end);
}

void WriteTokens(ThreadPool& pool, const WriteTokensArgs& a) {
  pool.ParallelFor(a.num_rows, TokenRowGrain(a.arena.layout, a.dtype),
                   [&](int64_t begin, int64_t end) { WriteRows(a, begin, end); });
}

void ReadTokens(ThreadPool& pool, const ReadTokensArgs& a) {
  pool.ParallelFor(a.num_rows, TokenRowGrain(a.arena.layout, a.dtype),
                   [&](int64_t begin, int64_t end) { ReadRows(a, begin, end); });
}

// Record copies are memory-bound: larger chunks than the codec's keep the per-chunk overhead
// small.
void ReadRecords(ThreadPool& pool, const ReadRecordsArgs& a) {
  const size_t rec = a.arena.layout.record_bytes;
  pool.ParallelFor(a.num_rows, kRowGrain * 4, [&](int64_t begin, int64_t end) {
    uint8_t* keys = static_cast<uint8_t*>(a.keys);
    uint8_t* values = static_cast<uint8_t*>(a.values);
    for (int64_t r = begin; r < end; ++r) {
      const int32_t b = a.src_blocks[r], s = a.src_slots[r];
      if (keys != nullptr) std::memcpy(keys + r * rec, KeyRecord(a.arena, b, s), rec);
      if (values != nullptr) std::memcpy(values + r * rec, ValueRecord(a.arena, b, s), rec);
    }
  });
}

void Gather(ThreadPool& pool, const GatherArgs& a) {
  const size_t rec = a.src.layout.record_bytes;
  pool.ParallelFor(a.num_rows, kRowGrain * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t sb = a.src_blocks[r], ss = a.src_slots[r];
      const int32_t db = a.dst_blocks[r], ds = a.dst_slots[r];
      std::memcpy(KeyRecord(a.dst, db, ds), KeyRecord(a.src, sb, ss), rec);
      std::memcpy(ValueRecord(a.dst, db, ds), ValueRecord(a.src, sb, ss), rec);
    }
  });
}

void Rerotate(ThreadPool& pool, const RerotateArgs& a) {
  const BlockLayout& l = a.arena.layout;
  pool.ParallelFor(a.num_rows, kRowGrain, [&](int64_t begin, int64_t end) {
    alignas(64) float x[kMaxHeadDim];
    for (int64_t r = begin; r < end; ++r) {
      uint8_t* rec = KeyRecord(a.arena, a.blocks[r], a.slots[r]);
      DequantizeRecord(l.format, l.head_dim, rec, x);
      RopeRotate(a.rope, l.head_dim, a.deltas[r], x);
      QuantizeRecord(l.format, l.head_dim, x, rec);
    }
  });
}

// Blocks hashed per task: a block is a few KiB, so tasks of this many amortize scheduling.
constexpr int64_t kChecksumGrain = 64;

void ChecksumBlocks(ThreadPool& pool, const ChecksumBlocksArgs& a) {
  const size_t bb = a.arena.layout.block_bytes;
  pool.ParallelFor(a.num_blocks, kChecksumGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      a.checksums[i] = Xxh64(
          static_cast<const uint8_t*>(a.arena.base) + static_cast<size_t>(a.blocks[i]) * bb, bb);
    }
  });
}

}  // namespace kvc::kernels::cpu
