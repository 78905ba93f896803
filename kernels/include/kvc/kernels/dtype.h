// Element types and storage formats of KV data, and scalar f16/bf16 conversions.
// Plain C++17: no CUDA, Abseil, protobuf or gRPC. Shared by every backend and the service.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvc::kernels {

// Element type of dense keys/values as engines send and receive them.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
};

// Bytes of one element of `dtype`.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

constexpr const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

// How one token of one (layer, kv head) is stored in a block. Raw formats keep the
// elements as they are; low-bit formats quantize along head_dim inside the token, so a
// token stays self-contained when others are evicted or moved (see docs/KERNELS.md).
enum class StorageFormat : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kFp8E4M3 = 3,  // FP8 E4M3 values, one f32 scale per token-head
  kInt8 = 4,     // symmetric INT8, one f32 scale per token-head
  kInt4G32 = 5,  // asymmetric INT4, groups of 32 along head_dim (f16 scale + f16 zero)
  kInt4G64 = 6,  // asymmetric INT4, groups of 64 along head_dim (f16 scale + f16 zero)
  kNvfp4 = 7,    // E2M1 values, E4M3 scale per 16 elements, f32 tensor scale per token-head
};
constexpr int kNumStorageFormats = 8;

constexpr const char* StorageFormatName(StorageFormat format) {
  switch (format) {
    case StorageFormat::kF32: return "f32";
    case StorageFormat::kF16: return "f16";
    case StorageFormat::kBF16: return "bf16";
    case StorageFormat::kFp8E4M3: return "fp8_e4m3";
    case StorageFormat::kInt8: return "int8";
    case StorageFormat::kInt4G32: return "int4_g32";
    case StorageFormat::kInt4G64: return "int4_g64";
    case StorageFormat::kNvfp4: return "nvfp4";
  }
  return "?";
}

// True for formats that store elements without arithmetic (bytes copy exactly when the
// input dtype matches).
constexpr bool IsRawFormat(StorageFormat format) {
  return format == StorageFormat::kF32 || format == StorageFormat::kF16 ||
         format == StorageFormat::kBF16;
}

constexpr StorageFormat RawFormatFor(DType dtype) {
  switch (dtype) {
    case DType::kF32: return StorageFormat::kF32;
    case DType::kF16: return StorageFormat::kF16;
    case DType::kBF16: return StorageFormat::kBF16;
  }
  return StorageFormat::kF32;
}

// IEEE 754 half <-> float, round to nearest even; handles subnormals, inf and NaN.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {                                               // subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) ... places mant into 10 bits
    uint32_t half_mant = mant >> (shift - 0);
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t h = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace kvc::kernels

namespace kvc::kernels {

// Converts `n` elements from `src` (of `src_dtype`) to `dst` (of `dst_dtype`). Same dtype is
// a plain copy (bit-exact). Buffers must not overlap.
inline void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                            size_t n) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * DTypeSize(src_dtype));
    return;
  }
  auto load = [&](size_t i) -> float {
    switch (src_dtype) {
      case DType::kF32: return static_cast<const float*>(src)[i];
      case DType::kF16: return HalfToFloat(static_cast<const uint16_t*>(src)[i]);
      case DType::kBF16: return BFloat16ToFloat(static_cast<const uint16_t*>(src)[i]);
    }
    return 0.0f;
  };
  for (size_t i = 0; i < n; ++i) {
    const float v = load(i);
    switch (dst_dtype) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = FloatToHalf(v); break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = FloatToBFloat16(v); break;
    }
  }
}

}  // namespace kvc::kernels
