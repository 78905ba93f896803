// Element types and storage formats of KV data, and scalar f16/bf16 conversions.
// Plain C++17: no CUDA, Abseil, protobuf or gRPC. Shared by every backend and the service.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvc/kernels/host_device.h"

namespace kvc::kernels {

// The vocabulary of element types and storage formats, defined once. Each row:
//   X(enumerator, value here, value on the wire (kvcache.v1), wire suffix, name)
// The wire numbers are kvcache.v1.DType's / StorageFormat's (0 there is "unspecified"); the
// C++ client's enums use them. Everything else is derived from these rows or checked against
// them at compile time: this header's enums and names, the service's proto conversion
// (cachesvc/rpc/proto_convert.cc: every proto value must have a row), the client's
// (client/src/convert.cc, kernel_types.h: its enums' numbers must match). Adding a format is
// one row here plus its line in types.proto and the client's enum (refused at compile time
// until they agree), its kernel code (record_codec.h, block_layout.h) and its tests:
// CONTRIBUTING.md "A storage format".
#define KVC_DTYPES(X)       \
  X(kF32, 0, 1, F32, "f32") \
  X(kF16, 1, 2, F16, "f16") \
  X(kBF16, 2, 3, BF16, "bf16")

// How one token of one (layer, kv head) is stored in a block. Raw formats keep the
// elements as they are; low-bit formats quantize along head_dim inside the token, so a
// token stays self-contained when others are evicted or moved (see docs/KERNELS.md).
//   fp8_e4m3: FP8 E4M3 values, one f32 scale per token-head
//   int8:     symmetric INT8, one f32 scale per token-head
//   int4_g32: asymmetric INT4, groups of 32 along head_dim (f16 scale + f16 zero)
//   int4_g64: asymmetric INT4, groups of 64 along head_dim (f16 scale + f16 zero)
//   nvfp4:    E2M1 values, E4M3 scale per 16 elements, f32 tensor scale per token-head
#define KVC_STORAGE_FORMATS(X)            \
  X(kF32, 0, 1, F32, "f32")               \
  X(kF16, 1, 2, F16, "f16")               \
  X(kBF16, 2, 3, BF16, "bf16")            \
  X(kFp8E4M3, 3, 4, FP8_E4M3, "fp8_e4m3") \
  X(kInt8, 4, 5, INT8, "int8")            \
  X(kInt4G32, 5, 6, INT4_G32, "int4_g32") \
  X(kInt4G64, 6, 7, INT4_G64, "int4_g64") \
  X(kNvfp4, 7, 8, NVFP4, "nvfp4")

#define KVC_VOCAB_ENUMERATOR(e, k, w, p, n) e = k,
#define KVC_VOCAB_COUNT(e, k, w, p, n) +1
#define KVC_VOCAB_NAME_CASE(e, k, w, p, n) \
  case decltype(value)::e:                 \
    return n;

// Element type of dense keys/values as engines send and receive them.
enum class DType : uint8_t { KVC_DTYPES(KVC_VOCAB_ENUMERATOR) };
constexpr int kNumDTypes = 0 KVC_DTYPES(KVC_VOCAB_COUNT);

// Bytes of one element of `dtype`.
constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

constexpr const char* DTypeName(DType value) {
  switch (value) { KVC_DTYPES(KVC_VOCAB_NAME_CASE) }
  return "?";
}

enum class StorageFormat : uint8_t { KVC_STORAGE_FORMATS(KVC_VOCAB_ENUMERATOR) };
constexpr int kNumStorageFormats = 0 KVC_STORAGE_FORMATS(KVC_VOCAB_COUNT);

constexpr const char* StorageFormatName(StorageFormat value) {
  switch (value) { KVC_STORAGE_FORMATS(KVC_VOCAB_NAME_CASE) }
  return "?";
}

// Arrays are indexed by these values: they must be 0..N-1 in the rows' order.
namespace vocab_check {
#define KVC_VOCAB_INDEX(e, k, w, p, n) k,
constexpr int kDTypeValues[] = {KVC_DTYPES(KVC_VOCAB_INDEX)};
constexpr int kFormatValues[] = {KVC_STORAGE_FORMATS(KVC_VOCAB_INDEX)};
#undef KVC_VOCAB_INDEX
constexpr bool Dense(const int* values, int n) {
  for (int i = 0; i < n; ++i) {
    if (values[i] != i) return false;
  }
  return true;
}
static_assert(Dense(kDTypeValues, kNumDTypes), "KVC_DTYPES: values must be 0..N-1 in order");
static_assert(Dense(kFormatValues, kNumStorageFormats),
              "KVC_STORAGE_FORMATS: values must be 0..N-1 in order");
}  // namespace vocab_check

// True for formats that store elements without arithmetic (bytes copy exactly when the
// input dtype matches).
constexpr bool IsRawFormat(StorageFormat format) {
  return format == StorageFormat::kF32 || format == StorageFormat::kF16 ||
         format == StorageFormat::kBF16;
}

constexpr StorageFormat RawFormatFor(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return StorageFormat::kF32;
    case DType::kF16:
      return StorageFormat::kF16;
    case DType::kBF16:
      return StorageFormat::kBF16;
  }
  return StorageFormat::kF32;
}

// IEEE 754 half <-> float, round to nearest even; handles subnormals, inf and NaN.
// Branch-free (selects only) so that loops over elements vectorize on the CPU backend.
KVC_HD float HalfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;  // exact conversion in one instruction (what cuda_fp16.h's __half2float emits)
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#endif
  const uint32_t kShiftedExp = 0x7c00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = kShiftedExp & o;
  o += (127u - 15u) << 23;
  const uint32_t inf_nan = o + ((128u - 16u) << 23);
  // Zero/subnormal: renormalize by letting the FPU subtract the implicit bit's value.
  const float sub = BitsAsFloat(o + (1u << 23)) - BitsAsFloat(113u << 23);
  o = exp == kShiftedExp ? inf_nan : o;
  o = exp == 0 ? FloatAsBits(sub) : o;
  return BitsAsFloat(o | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

KVC_HD uint16_t FloatToHalf(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t out;  // round to nearest even, overflow to inf: the same rounding as below
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(f));
  return out;
#endif
  // Selects instead of branches (vectorizes): each path is computed, the right one kept.
  const uint32_t x = FloatAsBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  // Normal results: rebias, then round at bit 13 (ties to even); overflow carries to inf.
  const uint32_t normal = (abs + ((15u - 127u) << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5 makes the FPU round at the f16 subnormal step (2^-24).
  const uint32_t sub = FloatAsBits(BitsAsFloat(abs) + 0.5f) - FloatAsBits(0.5f);
  uint32_t h = abs < 0x38800000u ? sub : normal;
  h = abs >= 0x477ff000u ? 0x7c00u : h;  // overflow -> inf
  h = abs > 0x7f800000u ? 0x7e00u : h;   // NaN -> quiet NaN
  return static_cast<uint16_t>(sign | h);
}

KVC_HD float BFloat16ToFloat(uint16_t b) { return BitsAsFloat(static_cast<uint32_t>(b) << 16); }

KVC_HD uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatAsBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x40u;  // keep NaNs NaN (quiet)
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Element i of a dense array of `dtype`, as float.
KVC_HD float LoadElement(const void* p, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

// Stores v as element i of a dense array of `dtype` (round to nearest even).
KVC_HD void StoreElement(void* p, DType dtype, size_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBFloat16(v);
      break;
  }
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
      case DType::kF32:
        return static_cast<const float*>(src)[i];
      case DType::kF16:
        return HalfToFloat(static_cast<const uint16_t*>(src)[i]);
      case DType::kBF16:
        return BFloat16ToFloat(static_cast<const uint16_t*>(src)[i]);
    }
    return 0.0f;
  };
  for (size_t i = 0; i < n; ++i) {
    const float v = load(i);
    switch (dst_dtype) {
      case DType::kF32:
        static_cast<float*>(dst)[i] = v;
        break;
      case DType::kF16:
        static_cast<uint16_t*>(dst)[i] = FloatToHalf(v);
        break;
      case DType::kBF16:
        static_cast<uint16_t*>(dst)[i] = FloatToBFloat16(v);
        break;
    }
  }
}

}  // namespace kvc::kernels
