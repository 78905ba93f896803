#include "client/decode/record_decode.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVC_DECODE_SSSE3 1
#endif

namespace kvc::client::internal {
namespace {

using kernels::DType;
using kernels::StorageFormat;

template <DType kOut>
struct Out;
template <>
struct Out<DType::kF32> {
  using T = float;
  static float From(float v) { return v; }
};
template <>
struct Out<DType::kF16> {
  using T = uint16_t;
  static uint16_t From(float v) { return kernels::FloatToHalf(v); }
};
template <>
struct Out<DType::kBF16> {
  using T = uint16_t;
  static uint16_t From(float v) { return kernels::FloatToBFloat16(v); }
};

// 2-byte outputs of `n` (a multiple of 16) nibbles packed two to a byte, low nibble first,
// each looked up in a 16-entry table: 16 elements per step with two byte shuffles (the
// table's low and high bytes).
#ifdef KVC_DECODE_SSSE3
__attribute__((target("ssse3"))) void LookUpNibbles16(const uint8_t* packed, int n,
                                                      const uint16_t* table, uint16_t* out) {
  alignas(16) uint8_t lo[16];
  alignas(16) uint8_t hi[16];
  for (int i = 0; i < 16; ++i) {
    lo[i] = static_cast<uint8_t>(table[i]);
    hi[i] = static_cast<uint8_t>(table[i] >> 8);
  }
  const __m128i tlo = _mm_load_si128(reinterpret_cast<const __m128i*>(lo));
  const __m128i thi = _mm_load_si128(reinterpret_cast<const __m128i*>(hi));
  const __m128i mask = _mm_set1_epi8(15);
  for (int j = 0; j < n; j += 16) {
    const __m128i p = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + j / 2));
    // Element 2i is byte i's low nibble, 2i + 1 its high one.
    const __m128i idx =
        _mm_unpacklo_epi8(_mm_and_si128(p, mask), _mm_and_si128(_mm_srli_epi16(p, 4), mask));
    const __m128i l = _mm_shuffle_epi8(tlo, idx);
    const __m128i h = _mm_shuffle_epi8(thi, idx);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm_unpacklo_epi8(l, h));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j + 8), _mm_unpackhi_epi8(l, h));
  }
}
const bool kHasSsse3 = __builtin_cpu_supports("ssse3");
#endif

template <typename T>
void LookUpNibbles(const uint8_t* packed, int n, const T* table, T* out) {
#ifdef KVC_DECODE_SSSE3
  if constexpr (sizeof(T) == 2) {
    if (kHasSsse3) {
      LookUpNibbles16(packed, n, table, out);
      return;
    }
  }
#endif
  for (int i = 0; i < n / 2; ++i) {
    out[2 * i] = table[packed[i] & 15u];
    out[2 * i + 1] = table[packed[i] >> 4];
  }
}

// 4-bit formats: per scale group, the 16 values a code can take, computed with the
// specification's own float expression (so each equals its DequantizeRecord value) and
// converted to the dtype (all groups of a record in one loop, which vectorizes); then every
// element is a table lookup.
template <DType kOut>
void DecodeNibbleRecords(StorageFormat format, int d, size_t record_bytes, const uint8_t* records,
                         size_t count, typename Out<kOut>::T* out) {
  using T = typename Out<kOut>::T;
  const bool nvfp4 = format == StorageFormat::kNvfp4;
  const int group = nvfp4 ? 16 : format == StorageFormat::kInt4G32 ? 32 : 64;
  const int groups = d / group;
  float values[kernels::kMaxHeadDim];  // 16 per group: at most d
  T tables[kernels::kMaxHeadDim];
  for (size_t r = 0; r < count; ++r, out += d) {
    const uint8_t* rec = records + r * record_bytes;
    if (nvfp4) {
      const float t = kernels::LoadF32(rec + kernels::Nvfp4TensorScaleOffset(d));
      for (int b = 0; b < groups; ++b) {
        const float eff = kernels::E4M3ToFloat(rec[d / 2 + b]) * t;
        for (int i = 0; i < 16; ++i) {
          values[16 * b + i] = kernels::E2M1ToFloat(static_cast<uint8_t>(i)) * eff;
        }
      }
    } else {
      for (int g = 0; g < groups; ++g) {
        const float scale = kernels::HalfToFloat(kernels::LoadU16(rec + d / 2 + 4 * g));
        const float min = kernels::HalfToFloat(kernels::LoadU16(rec + d / 2 + 4 * g + 2));
        for (int i = 0; i < 16; ++i) values[16 * g + i] = static_cast<float>(i) * scale + min;
      }
    }
    for (int i = 0; i < 16 * groups; ++i) tables[i] = Out<kOut>::From(values[i]);
    for (int g = 0; g < groups; ++g) {
      LookUpNibbles(rec + g * group / 2, group, tables + 16 * g, out + g * group);
    }
  }
}

// Other formats: a record to floats with the specification, then a conversion loop
// specialized for the dtype (no per-element switch; vectorizable).
template <DType kOut>
void DecodeByFloats(StorageFormat format, int d, size_t record_bytes, const uint8_t* records,
                    size_t count, typename Out<kOut>::T* out) {
  float x[kernels::kMaxHeadDim];
  for (size_t r = 0; r < count; ++r, out += d) {
    kernels::DequantizeRecord(format, d, records + r * record_bytes, x);
    for (int j = 0; j < d; ++j) out[j] = Out<kOut>::From(x[j]);
  }
}

template <DType kOut>
void Decode(StorageFormat format, int d, size_t record_bytes, const uint8_t* records, size_t count,
            void* out) {
  auto* o = static_cast<typename Out<kOut>::T*>(out);
  switch (format) {
    case StorageFormat::kInt4G32:
    case StorageFormat::kInt4G64:
    case StorageFormat::kNvfp4:
      DecodeNibbleRecords<kOut>(format, d, record_bytes, records, count, o);
      return;
    default:
      DecodeByFloats<kOut>(format, d, record_bytes, records, count, o);
      return;
  }
}

}  // namespace

void DecodeRecords(StorageFormat format, DType dtype, int d, size_t record_bytes,
                   const uint8_t* records, size_t count, void* out) {
  if (d <= 0 || d > kernels::kMaxHeadDim) {
    DecodeRecordsReference(format, dtype, d, record_bytes, records, count, out);
    return;
  }
  switch (dtype) {
    case DType::kF32:
      Decode<DType::kF32>(format, d, record_bytes, records, count, out);
      return;
    case DType::kF16:
      Decode<DType::kF16>(format, d, record_bytes, records, count, out);
      return;
    case DType::kBF16:
      Decode<DType::kBF16>(format, d, record_bytes, records, count, out);
      return;
  }
  DecodeRecordsReference(format, dtype, d, record_bytes, records, count, out);
}

void DecodeRecordsReference(StorageFormat format, DType dtype, int d, size_t record_bytes,
                            const uint8_t* records, size_t count, void* out) {
  const size_t row = static_cast<size_t>(d) * kernels::DTypeSize(dtype);
  for (size_t r = 0; r < count; ++r) {
    for (int j = 0; j < d; ++j) {
      kernels::StoreElement(static_cast<char*>(out) + r * row, dtype, static_cast<size_t>(j),
                            kernels::DequantizeElement(format, d, records + r * record_bytes, j));
    }
  }
}

}  // namespace kvc::client::internal
