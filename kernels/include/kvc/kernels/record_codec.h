// The byte layout of one token record (the key or the value of one token of one kv head)
// for every StorageFormat, and the scalar code that writes and reads it. This header is the
// specification of the formats: the reference, CPU and CUDA backends all call these
// functions, so a record quantized by one backend reads back identically on another.
//
// Record layouts for head_dim d (byte offsets; all multi-byte fields little-endian):
//   f32 / f16 / bf16  [0, d*size)       elements as stored by the engine
//   fp8_e4m3          [0, d)            E4M3 codes of x / s
//                     [d, d+4)          f32 s = amax / 448
//   int8              [0, d)            int8 codes q = rne(clamp(x / s, -127, 127))
//                     [d, d+4)          f32 s = amax / 127
//   int4_g32/g64      [0, d/2)          nibbles: byte i = q[2i] | q[2i+1] << 4, q in 0..15
//                     [d/2, d/2+4*G)    per group g of 32/64 elements: f16 scale at +4g,
//                                       f16 min at +4g+2; x ~= q * scale + min
//   nvfp4             [0, d/2)          E2M1 codes (sign in bit 3), same nibble packing
//                     [d/2, d/2+d/16)   E4M3 block scale per 16 elements
//                     [A, A+4)          f32 tensor scale t = amax / (448 * 6),
//                                       A = align4(d/2 + d/16); x ~= e2m1 * e4m3 * t
// Zero tokens (amax == 0) store zero scales and zero codes and read back as exact zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvc/kernels/block_layout.h"
#include "kvc/kernels/dtype.h"
#include "kvc/kernels/fp_formats.h"
#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

constexpr int kMaxHeadDim = 512;  // bounds per-thread scratch in every backend

constexpr int Nvfp4TensorScaleOffset(int head_dim) {
  return static_cast<int>(AlignUp(static_cast<size_t>(head_dim / 2 + head_dim / 16), 4));
}
static_assert(Nvfp4TensorScaleOffset(128) == 72, "nvfp4 d=128: 64 nibble bytes + 8 scales");
static_assert(Nvfp4TensorScaleOffset(64) == 36, "nvfp4 d=64");

KVC_HD float LoadF32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const float*>(p);  // records keep f32 fields 4-byte aligned
#else
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

KVC_HD void StoreF32(uint8_t* p, float v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

// 16-bit fields sit at even offsets. Hosts and GPUs we target are little-endian.
KVC_HD uint16_t LoadU16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

KVC_HD void StoreU16(uint8_t* p, uint16_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint16_t*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

// max |x[j]|, computed on the bit patterns: for non-NaN floats the order of |x| is the
// unsigned order of (bits & 0x7fffffff), and integer max reductions vectorize where float
// ones may not (NaN ordering). A NaN input makes the result NaN.
KVC_HD float AbsMax(const float* KVC_RESTRICT x, int n) {
  uint32_t m = 0;
  for (int j = 0; j < n; ++j) {
    const uint32_t a = FloatAsBits(x[j]) & 0x7fffffffu;
    m = a > m ? a : m;
  }
  return BitsAsFloat(m);
}

// Float order as unsigned integer order (negative values flipped), and back.
KVC_HD uint32_t OrderedBits(float f) {
  const uint32_t u = FloatAsBits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
KVC_HD float FromOrderedBits(uint32_t o) {
  return BitsAsFloat((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// Two 4-bit codes per byte, element 2i in the low nibble (n even).
KVC_HD void PackNibbles(const uint8_t* KVC_RESTRICT q, int n, uint8_t* KVC_RESTRICT out) {
  for (int i = 0; i < n / 2; ++i) out[i] = static_cast<uint8_t>(q[2 * i] | (q[2 * i + 1] << 4));
}
KVC_HD void UnpackNibbles(const uint8_t* KVC_RESTRICT in, int n, uint8_t* KVC_RESTRICT q) {
  for (int i = 0; i < n / 2; ++i) {
    q[2 * i] = in[i] & 15u;
    q[2 * i + 1] = static_cast<uint8_t>(in[i] >> 4);
  }
}

// Writes one record of `format` from d floats.
KVC_HD_INLINE void QuantizeRecord(StorageFormat format, int d, const float* KVC_RESTRICT x,
                                  uint8_t* KVC_RESTRICT rec) {
  switch (format) {
    case StorageFormat::kF32:
      for (int j = 0; j < d; ++j) StoreF32(rec + 4 * j, x[j]);
      return;
    case StorageFormat::kF16:
      for (int j = 0; j < d; ++j) StoreU16(rec + 2 * j, FloatToHalf(x[j]));
      return;
    case StorageFormat::kBF16:
      for (int j = 0; j < d; ++j) StoreU16(rec + 2 * j, FloatToBFloat16(x[j]));
      return;
    case StorageFormat::kFp8E4M3: {
      const float scale = AbsMax(x, d) / kE4M3Max;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int j = 0; j < d; ++j) rec[j] = FloatToE4M3(x[j] * inv);
      StoreF32(rec + d, scale);
      return;
    }
    case StorageFormat::kInt8: {
      const float scale = AbsMax(x, d) / 127.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int j = 0; j < d; ++j) {
        const float q = RoundHalfEven(ClampF(x[j] * inv, -127.0f, 127.0f));
        // A NaN element (its amax and so its scale are NaN too) gets code 0: converting NaN
        // to an integer is undefined in C++, and 0 is the byte that x86's conversion (the
        // vector paths' too) produces, so no stored record changes.
        rec[j] = q == q ? static_cast<uint8_t>(static_cast<int8_t>(q)) : 0;
      }
      StoreF32(rec + d, scale);
      return;
    }
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int group = format == StorageFormat::kInt4G32 ? 32 : 64;
      for (int g = 0; g < d / group; ++g) {
        const float* KVC_RESTRICT xg = x + g * group;
        uint32_t lo_o = 0xffffffffu, hi_o = 0;
        for (int j = 0; j < group; ++j) {
          const uint32_t o = OrderedBits(xg[j]);
          lo_o = o < lo_o ? o : lo_o;
          hi_o = o > hi_o ? o : hi_o;
        }
        const float lo = FromOrderedBits(lo_o), hi = FromOrderedBits(hi_o);
        // Quantize against the f16-rounded scale and min that the reader will see.
        const uint16_t scale_h = FloatToHalf((hi - lo) / 15.0f);
        const uint16_t min_h = FloatToHalf(lo);
        const float scale = HalfToFloat(scale_h);
        const float min = HalfToFloat(min_h);
        const float inv = scale > 0 ? 1.0f / scale : 0.0f;
        uint8_t q[64];
        for (int j = 0; j < group; ++j) {
          const float c = RoundHalfEven(ClampF((xg[j] - min) * inv, 0.0f, 15.0f));
          q[j] = c == c ? static_cast<uint8_t>(c) : 0;  // NaN: code 0, as for INT8 above
        }
        PackNibbles(q, group, rec + g * group / 2);
        StoreU16(rec + d / 2 + 4 * g, scale_h);
        StoreU16(rec + d / 2 + 4 * g + 2, min_h);
      }
      return;
    }
    case StorageFormat::kNvfp4: {
      const float t = AbsMax(x, d) / (kE4M3Max * kE2M1Max);
      uint8_t* block_scales = rec + d / 2;
      for (int b = 0; b < d / 16; ++b) {
        const float* xb = x + b * 16;
        uint8_t sb = 0;
        float inv = 0.0f;
        if (t > 0) {
          sb = FloatToE4M3(AbsMax(xb, 16) / (kE2M1Max * t));
          const float eff = E4M3ToFloat(sb) * t;
          inv = eff > 0 ? 1.0f / eff : 0.0f;
        }
        block_scales[b] = sb;
        uint8_t q[16];
        for (int j = 0; j < 16; ++j) q[j] = FloatToE2M1(xb[j] * inv);
        PackNibbles(q, 16, rec + b * 8);
      }
      for (int p = d / 2 + d / 16; p < Nvfp4TensorScaleOffset(d); ++p) rec[p] = 0;
      StoreF32(rec + Nvfp4TensorScaleOffset(d), t);
      return;
    }
  }
}

// Element j of a record of `format`, as float.
KVC_HD float DequantizeElement(StorageFormat format, int d, const uint8_t* rec, int j) {
  switch (format) {
    case StorageFormat::kF32:
      return LoadF32(rec + 4 * j);
    case StorageFormat::kF16:
      return HalfToFloat(LoadU16(rec + 2 * j));
    case StorageFormat::kBF16:
      return BFloat16ToFloat(LoadU16(rec + 2 * j));
    case StorageFormat::kFp8E4M3:
      return E4M3ToFloat(rec[j]) * LoadF32(rec + d);
    case StorageFormat::kInt8:
      return static_cast<float>(static_cast<int8_t>(rec[j])) * LoadF32(rec + d);
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int g = j / (format == StorageFormat::kInt4G32 ? 32 : 64);
      const uint32_t q = (rec[j / 2] >> (4 * (j & 1))) & 15u;
      const float scale = HalfToFloat(LoadU16(rec + d / 2 + 4 * g));
      const float min = HalfToFloat(LoadU16(rec + d / 2 + 4 * g + 2));
      return static_cast<float>(q) * scale + min;
    }
    case StorageFormat::kNvfp4: {
      const uint8_t q = static_cast<uint8_t>((rec[j / 2] >> (4 * (j & 1))) & 15u);
      const float eff = E4M3ToFloat(rec[d / 2 + j / 16]) * LoadF32(rec + Nvfp4TensorScaleOffset(d));
      return E2M1ToFloat(q) * eff;
    }
  }
  return 0.0f;
}

// All d elements of a record, as float. Same values as DequantizeElement, with the scales
// loaded once per group.
KVC_HD_INLINE void DequantizeRecord(StorageFormat format, int d, const uint8_t* KVC_RESTRICT rec,
                                    float* KVC_RESTRICT out) {
  switch (format) {
    case StorageFormat::kF32:
      for (int j = 0; j < d; ++j) out[j] = LoadF32(rec + 4 * j);
      return;
    case StorageFormat::kF16:
      for (int j = 0; j < d; ++j) out[j] = HalfToFloat(LoadU16(rec + 2 * j));
      return;
    case StorageFormat::kBF16:
      for (int j = 0; j < d; ++j) out[j] = BFloat16ToFloat(LoadU16(rec + 2 * j));
      return;
    case StorageFormat::kFp8E4M3:
    case StorageFormat::kInt8: {
      const float s = LoadF32(rec + d);
      if (format == StorageFormat::kInt8) {
        for (int j = 0; j < d; ++j) out[j] = static_cast<float>(static_cast<int8_t>(rec[j])) * s;
      } else {
        for (int j = 0; j < d; ++j) out[j] = E4M3ToFloat(rec[j]) * s;
      }
      return;
    }
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64: {
      const int group = format == StorageFormat::kInt4G32 ? 32 : 64;
      for (int g = 0; g < d / group; ++g) {
        const float scale = HalfToFloat(LoadU16(rec + d / 2 + 4 * g));
        const float min = HalfToFloat(LoadU16(rec + d / 2 + 4 * g + 2));
        uint8_t q[64];
        UnpackNibbles(rec + g * group / 2, group, q);
        float* KVC_RESTRICT o = out + g * group;
        for (int j = 0; j < group; ++j) o[j] = static_cast<float>(q[j]) * scale + min;
      }
      return;
    }
    case StorageFormat::kNvfp4: {
      const float t = LoadF32(rec + Nvfp4TensorScaleOffset(d));
      // Low and high nibbles decoded by two contiguous loops (vectorizable), then
      // interleaved; a byte-wise unpack into a buffer stalls on store forwarding.
      for (int b = 0; b < d / 16; ++b) {
        const float eff = E4M3ToFloat(rec[d / 2 + b]) * t;
        float lo[8], hi[8];
        for (int i = 0; i < 8; ++i) {
          lo[i] = E2M1ToFloat(rec[b * 8 + i] & 15u) * eff;
          hi[i] = E2M1ToFloat(static_cast<uint8_t>(rec[b * 8 + i] >> 4)) * eff;
        }
        for (int i = 0; i < 8; ++i) {
          out[b * 16 + 2 * i] = lo[i];
          out[b * 16 + 2 * i + 1] = hi[i];
        }
      }
      return;
    }
  }
}

}  // namespace kvc::kernels
