// The same-node reader's decode (client/decode/record_decode.h) against its specification,
// kernels::DequantizeElement then kernels::StoreElement: bit for bit, for every storage
// format, output dtype and head_dim the service accepts, on records the service would write
// and on arbitrary bytes.
#include "client/decode/record_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvc/kernels/block_layout.h"

namespace kvc::client::internal {
namespace {

using kernels::DType;
using kernels::StorageFormat;

constexpr StorageFormat kFormats[] = {
    StorageFormat::kF32,  StorageFormat::kF16,     StorageFormat::kBF16,    StorageFormat::kFp8E4M3,
    StorageFormat::kInt8, StorageFormat::kInt4G32, StorageFormat::kInt4G64, StorageFormat::kNvfp4};
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

float ElementOf(const std::vector<uint8_t>& rows, DType dtype, size_t i) {
  uint16_t h = 0;
  switch (dtype) {
    case DType::kF32: {
      float f = 0;
      std::memcpy(&f, rows.data() + 4 * i, 4);
      return f;
    }
    case DType::kF16:
      std::memcpy(&h, rows.data() + 2 * i, 2);
      return kernels::HalfToFloat(h);
    case DType::kBF16:
      std::memcpy(&h, rows.data() + 2 * i, 2);
      return kernels::BFloat16ToFloat(h);
  }
  return 0;
}

// Decodes `count` records both ways and compares the outputs byte for byte (a NaN of the
// specification may come out as another NaN's bits: equal when both are NaN).
void ExpectSameAsSpecification(StorageFormat format, DType dtype, int d, size_t stride,
                               const std::vector<uint8_t>& records, size_t count) {
  const size_t row = static_cast<size_t>(d) * kernels::DTypeSize(dtype);
  std::vector<uint8_t> want(count * row, 0xAB);
  std::vector<uint8_t> got(count * row + 64, 0xCD);
  DecodeRecordsReference(format, dtype, d, stride, records.data(), count, want.data());
  DecodeRecords(format, dtype, d, stride, records.data(), count, got.data());
  for (size_t i = 0; i < count * static_cast<size_t>(d); ++i) {
    const size_t e = kernels::DTypeSize(dtype);
    if (std::memcmp(want.data() + i * e, got.data() + i * e, e) == 0) continue;
    const float w = ElementOf(want, dtype, i);
    const float g = ElementOf(got, dtype, i);
    if (std::isnan(w) && std::isnan(g)) continue;
    FAIL() << kernels::StorageFormatName(format) << " -> dtype " << static_cast<int>(dtype)
           << " d=" << d << ": row " << i / static_cast<size_t>(d) << " element "
           << i % static_cast<size_t>(d) << " is " << g << ", the specification says " << w;
  }
  for (size_t i = count * row; i < got.size(); ++i) {
    ASSERT_EQ(got[i], 0xCD) << "wrote past the last row (byte " << i - count * row << ")";
  }
}

TEST(RecordDecodeTest, EqualsTheSpecificationOnRecordsTheServiceWrites) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int cases = 0;
  for (StorageFormat format : kFormats) {
    for (int d : {16, 32, 64, 128, 192, 256, 512}) {
      if (!kernels::FormatSupportsHeadDim(format, d)) continue;
      const size_t rb = kernels::TokenRecordBytes(format, d);
      // 37 rows (not a multiple of anything), a few with outliers, one all zeros.
      const size_t count = 37;
      std::vector<uint8_t> records(count * rb);
      std::vector<float> x(static_cast<size_t>(d));
      for (size_t r = 0; r < count; ++r) {
        for (float& v : x) v = normal(rng) * (r % 5 == 0 ? 40.0f : 1.0f);
        if (r == 3) std::fill(x.begin(), x.end(), 0.0f);
        kernels::QuantizeRecord(format, d, x.data(), records.data() + r * rb);
      }
      for (DType dtype : kDTypes) {
        ExpectSameAsSpecification(format, dtype, d, rb, records, count);
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, 100);
}

TEST(RecordDecodeTest, EqualsTheSpecificationOnArbitraryBytesAndStrides) {
  // Every byte pattern a record can hold, scales included (NaN, infinity, subnormal), and a
  // stride wider than the record (the decoder must step by it, not by the record's size).
  std::mt19937 rng(11);
  for (StorageFormat format : kFormats) {
    for (int d : {64, 128}) {
      const size_t stride = kernels::TokenRecordBytes(format, d) + 48;
      const size_t count = 101;
      std::vector<uint8_t> records(count * stride);
      for (uint8_t& b : records) b = static_cast<uint8_t>(rng());
      for (DType dtype : kDTypes)
        ExpectSameAsSpecification(format, dtype, d, stride, records, count);
    }
  }
}

TEST(RecordDecodeTest, ZeroRowsWritesNothing) {
  std::vector<uint8_t> out(64, 0xCD);
  const uint8_t record[64] = {};
  DecodeRecords(StorageFormat::kInt4G64, DType::kF16, 64, 40, record, 0, out.data());
  for (uint8_t b : out) EXPECT_EQ(b, 0xCD);
}

}  // namespace
}  // namespace kvc::client::internal
