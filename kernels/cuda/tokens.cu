// CUDA write (quantize + scatter), read (gather + dequantize), record reads and gathers
// (byte copies) and RoPE re-rotation. Write and read use one warp per token row; lane l owns
// elements l + 32k, and group statistics are warp (or half-warp) reductions. The arithmetic is the
// same as QuantizeRecord's (max reductions are exact, the per-element ops identical), so
// records match the reference bit for bit.
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_ops.h"
#include "kvc/kernels/record_codec.h"
#include "kvc/kernels/rope.h"
#include "kvc/kernels/xxh64.h"

namespace kvc::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <int KMAX>
__device__ void QuantizeWarp(StorageFormat f, int d, const float (&x)[KMAX], int lane,
                             uint8_t* rec) {
  switch (f) {
    case StorageFormat::kF32:
    case StorageFormat::kF16:
    case StorageFormat::kBF16:
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int j = lane + 32 * k;
        if (j >= d) continue;
        if (f == StorageFormat::kF32)
          reinterpret_cast<float*>(rec)[j] = x[k];
        else if (f == StorageFormat::kF16)
          reinterpret_cast<uint16_t*>(rec)[j] = FloatToHalf(x[k]);
        else
          reinterpret_cast<uint16_t*>(rec)[j] = FloatToBFloat16(x[k]);
      }
      return;
    case StorageFormat::kFp8E4M3:
    case StorageFormat::kInt8: {
      // AbsMax of record_codec.h: max of |x| bit patterns, so a NaN element makes the scale
      // NaN as in QuantizeRecord (fmaxf would drop it). Padding is +0.
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) m = max(m, FloatAsBits(x[k]) & 0x7fffffffu);
      const float amax = BitsAsFloat(WarpMaxU32(m));
      const bool fp8 = f == StorageFormat::kFp8E4M3;
      const float scale = amax / (fp8 ? kE4M3Max : 127.0f);
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int j = lane + 32 * k;
        if (j >= d) continue;
        rec[j] = fp8 ? FloatToE4M3(x[k] * inv)
                     : static_cast<uint8_t>(
                           static_cast<int8_t>(RoundHalfEven(ClampF(x[k] * inv, -127.0f, 127.0f))));
      }
      if (lane == 0) StoreF32(rec + d, scale);
      return;
    }
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      // d % 32 == 0 here, so every lane's elements are valid. Group of element (lane, k):
      // k for g32, k / 2 for g64.
      // Min/max in OrderedBits order as QuantizeRecord does (-0 < +0, NaNs propagate);
      // fminf/fmaxf would drop NaNs and may order signed zeros either way.
      uint32_t lo[KMAX], hi[KMAX];
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const uint32_t o = OrderedBits(x[k]);
        lo[k] = WarpMinU32(o);
        hi[k] = WarpMaxU32(o);
      }
      const bool g64 = f == StorageFormat::kInt4G64;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int j = lane + 32 * k;
        uint32_t glo_o = lo[k], ghi_o = hi[k];
        if (g64) {
          const int k0 = k & ~1;
          glo_o = min(lo[k0], lo[k0 + 1 < KMAX ? k0 + 1 : k0]);
          ghi_o = max(hi[k0], hi[k0 + 1 < KMAX ? k0 + 1 : k0]);
        }
        const float glo = FromOrderedBits(glo_o), ghi = FromOrderedBits(ghi_o);
        const uint16_t scale_h = FloatToHalf((ghi - glo) / 15.0f);
        const uint16_t min_h = FloatToHalf(glo);
        const float scale = HalfToFloat(scale_h), mn = HalfToFloat(min_h);
        const float inv = scale > 0 ? 1.0f / scale : 0.0f;
        const uint32_t q =
            j < d ? static_cast<uint32_t>(RoundHalfEven(ClampF((x[k] - mn) * inv, 0.0f, 15.0f)))
                  : 0u;
        const uint32_t q_next = __shfl_down_sync(kFullMask, q, 1);
        if (j < d && (lane & 1) == 0) rec[j / 2] = static_cast<uint8_t>(q | (q_next << 4));
        const int group = g64 ? k / 2 : k;
        if (j < d && lane == 0 && (!g64 || (k & 1) == 0)) {
          reinterpret_cast<uint16_t*>(rec + d / 2)[2 * group] = scale_h;
          reinterpret_cast<uint16_t*>(rec + d / 2)[2 * group + 1] = min_h;
        }
      }
      return;
    }
    case StorageFormat::kNvfp4: {
      // AbsMax on bit patterns (NaN-propagating), as for FP8/INT8 above.
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) m = max(m, FloatAsBits(x[k]) & 0x7fffffffu);
      const float t = BitsAsFloat(WarpMaxU32(m)) / (kE4M3Max * kE2M1Max);
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        const int j = lane + 32 * k;
        // Block of 16 = this half-warp.
        const float bamax = BitsAsFloat(HalfWarpMaxU32(FloatAsBits(x[k]) & 0x7fffffffu));
        uint8_t sb = 0;
        float inv = 0.0f;
        if (t > 0) {
          sb = FloatToE4M3(bamax / (kE2M1Max * t));
          const float eff = E4M3ToFloat(sb) * t;
          inv = eff > 0 ? 1.0f / eff : 0.0f;
        }
        const uint32_t q = FloatToE2M1(x[k] * inv);
        const uint32_t q_next = __shfl_down_sync(kFullMask, q, 1);
        if (j < d && (lane & 1) == 0) rec[j / 2] = static_cast<uint8_t>(q | (q_next << 4));
        if (j < d && (lane & 15) == 0) rec[d / 2 + j / 16] = sb;
      }
      if (lane == 0) {
        for (int p = d / 2 + d / 16; p < Nvfp4TensorScaleOffset(d); ++p) rec[p] = 0;
        StoreF32(rec + Nvfp4TensorScaleOffset(d), t);
      }
      return;
    }
  }
}

template <int KMAX>
__global__ void WriteTokensKernel(WriteTokensArgs a, int64_t stride) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.num_rows) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int d = a.arena.layout.head_dim;
  const int32_t b = a.dst_blocks[row], s = a.dst_slots[row];
  for (int which = 0; which < 2; ++which) {
    const void* src = which == 0 ? a.keys : a.values;
    float x[KMAX];
#pragma unroll
    for (int k = 0; k < KMAX; ++k) {
      const int j = lane + 32 * k;
      x[k] = j < d ? LoadElement(src, a.dtype, row * stride + j) : 0.0f;
    }
    uint8_t* rec = which == 0 ? KeyRecord(a.arena, b, s) : ValueRecord(a.arena, b, s);
    QuantizeWarp<KMAX>(a.arena.layout.format, d, x, lane, rec);
  }
}

template <int KMAX>
__global__ void ReadTokensKernel(ReadTokensArgs a, int64_t stride) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.num_rows) return;
  const int lane = threadIdx.x & 31;
  const int d = a.arena.layout.head_dim;
  const StorageFormat f = a.arena.layout.format;
  const int32_t b = a.src_blocks[row], s = a.src_slots[row];
  const uint8_t* krec = KeyRecord(a.arena, b, s);
  const uint8_t* vrec = ValueRecord(a.arena, b, s);
#pragma unroll
  for (int k = 0; k < KMAX; ++k) {
    const int j = lane + 32 * k;
    if (j >= d) continue;
    if (a.keys != nullptr)
      StoreElement(a.keys, a.dtype, row * stride + j, DequantizeElement(f, d, krec, j));
    if (a.values != nullptr)
      StoreElement(a.values, a.dtype, row * stride + j, DequantizeElement(f, d, vrec, j));
  }
}

// Records are 4-byte multiples and 4-byte aligned in blocks and in the dense outputs.
__device__ __forceinline__ void CopyRecordWarp(uint32_t* dst, const uint32_t* src, int words,
                                               int lane) {
  for (int w = lane; w < words; w += 32) dst[w] = src[w];
}

__global__ void ReadRecordsKernel(ReadRecordsArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.num_rows) return;
  const int lane = threadIdx.x & 31;
  const int32_t b = a.src_blocks[row], s = a.src_slots[row];
  const size_t rec = a.arena.layout.record_bytes;
  const int words = static_cast<int>(rec / 4);
  if (a.keys != nullptr) {
    CopyRecordWarp(reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(a.keys) + row * rec),
                   reinterpret_cast<const uint32_t*>(KeyRecord(a.arena, b, s)), words, lane);
  }
  if (a.values != nullptr) {
    CopyRecordWarp(reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(a.values) + row * rec),
                   reinterpret_cast<const uint32_t*>(ValueRecord(a.arena, b, s)), words, lane);
  }
}

__global__ void GatherKernel(GatherArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= a.num_rows) return;
  const int lane = threadIdx.x & 31;
  const int32_t sb = a.src_blocks[row], ss = a.src_slots[row];
  const int32_t db = a.dst_blocks[row], ds = a.dst_slots[row];
  const int words = static_cast<int>(a.src.layout.record_bytes / 4);
  CopyRecordWarp(reinterpret_cast<uint32_t*>(KeyRecord(a.dst, db, ds)),
                 reinterpret_cast<const uint32_t*>(KeyRecord(a.src, sb, ss)), words, lane);
  CopyRecordWarp(reinterpret_cast<uint32_t*>(ValueRecord(a.dst, db, ds)),
                 reinterpret_cast<const uint32_t*>(ValueRecord(a.src, sb, ss)), words, lane);
}

// One thread per block: XXH64 is sequential within a block; a publish or attach checksums
// thousands of blocks at once.
__global__ void ChecksumBlocksKernel(ChecksumBlocksArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.num_blocks) return;
  const size_t bb = a.arena.layout.block_bytes;
  a.checksums[i] = Xxh64(static_cast<const uint8_t*>(a.arena.base) + a.blocks[i] * bb, bb);
}

// One thread per row with the shared scalar codec: re-rotation is rare next to reads.
__global__ void RerotateKernel(RerotateArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= a.num_rows) return;
  const BlockLayout& l = a.arena.layout;
  float x[kMaxHeadDim];
  uint8_t* rec = KeyRecord(a.arena, a.blocks[row], a.slots[row]);
  DequantizeRecord(l.format, l.head_dim, rec, x);
  RopeRotate(a.rope, l.head_dim, a.deltas[row], x);
  QuantizeRecord(l.format, l.head_dim, x, rec);
}

}  // namespace

KernelStatus LaunchWriteTokens(const WriteTokensArgs& a, StreamHandle stream) {
  if (a.num_rows == 0) return KernelStatus::Ok();
  const int64_t stride = a.row_stride == 0 ? a.arena.layout.head_dim : a.row_stride;
  return DispatchHeadDim(a.arena.layout.head_dim, [&](auto kmax) {
    WriteTokensKernel<decltype(kmax)::value>
        <<<Blocks(a.num_rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, ToStream(stream)>>>(a,
                                                                                           stride);
    return LaunchStatus();
  });
}

KernelStatus LaunchReadTokens(const ReadTokensArgs& a, StreamHandle stream) {
  if (a.num_rows == 0) return KernelStatus::Ok();
  const int64_t stride = a.row_stride == 0 ? a.arena.layout.head_dim : a.row_stride;
  return DispatchHeadDim(a.arena.layout.head_dim, [&](auto kmax) {
    ReadTokensKernel<decltype(kmax)::value>
        <<<Blocks(a.num_rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, ToStream(stream)>>>(a,
                                                                                           stride);
    return LaunchStatus();
  });
}

KernelStatus LaunchReadRecords(const ReadRecordsArgs& a, StreamHandle stream) {
  if (a.num_rows == 0) return KernelStatus::Ok();
  ReadRecordsKernel<<<Blocks(a.num_rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0,
                      ToStream(stream)>>>(a);
  return LaunchStatus();
}

KernelStatus LaunchGather(const GatherArgs& a, StreamHandle stream) {
  if (a.num_rows == 0) return KernelStatus::Ok();
  GatherKernel<<<Blocks(a.num_rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, ToStream(stream)>>>(a);
  return LaunchStatus();
}

KernelStatus LaunchChecksumBlocks(const ChecksumBlocksArgs& a, StreamHandle stream) {
  if (a.num_blocks == 0) return KernelStatus::Ok();
  ChecksumBlocksKernel<<<Blocks(a.num_blocks, 128), 128, 0, ToStream(stream)>>>(a);
  return LaunchStatus();
}

KernelStatus LaunchRerotate(const RerotateArgs& a, StreamHandle stream) {
  if (a.num_rows == 0) return KernelStatus::Ok();
  RerotateKernel<<<Blocks(a.num_rows, 64), 64, 0, ToStream(stream)>>>(a);
  return LaunchStatus();
}

}  // namespace kvc::kernels::cuda
