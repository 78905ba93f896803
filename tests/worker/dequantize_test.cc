// Block dequantization against hand-built blocks (ggml-common.h layouts).
#include "worker/engine/dequantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace kvc::worker {
namespace {

TEST(DequantizeTest, HalfRoundTripsAndHandlesSubnormals) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 5.9604645e-08f);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
}

TEST(DequantizeTest, Q4_1UsesScaleMinAndNibbleOrder) {
  std::vector<uint8_t> block(20);
  const uint16_t d = FloatToHalf(0.5f), m = FloatToHalf(-1.0f);
  std::memcpy(block.data(), &d, 2);
  std::memcpy(block.data() + 2, &m, 2);
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> out(32);
  ASSERT_TRUE(Dequantize(GgmlType::kQ4_1, block.data(), 32, out.data()).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_FLOAT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }
}

TEST(DequantizeTest, Q4_0CentersOnEight) {
  std::vector<uint8_t> block(18);
  const uint16_t d = FloatToHalf(2.0f);
  std::memcpy(block.data(), &d, 2);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | (j << 4));
  std::vector<float> out(32);
  ASSERT_TRUE(Dequantize(GgmlType::kQ4_0, block.data(), 32, out.data()).ok());
  EXPECT_FLOAT_EQ(out[0], -16.0f);
  EXPECT_FLOAT_EQ(out[31], 14.0f);
}

TEST(DequantizeTest, Q8_0AndF16) {
  std::vector<uint8_t> block(34);
  const uint16_t d = FloatToHalf(0.125f);
  std::memcpy(block.data(), &d, 2);
  for (int j = 0; j < 32; ++j)
    block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
  std::vector<float> out(32);
  ASSERT_TRUE(Dequantize(GgmlType::kQ8_0, block.data(), 32, out.data()).ok());
  EXPECT_FLOAT_EQ(out[0], -16.0f);
  EXPECT_FLOAT_EQ(out[31], 0.125f * 120);

  const uint16_t halves[2] = {FloatToHalf(1.5f), FloatToHalf(-0.25f)};
  ASSERT_TRUE(Dequantize(GgmlType::kF16, halves, 2, out.data()).ok());
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_FLOAT_EQ(out[1], -0.25f);
}

TEST(DequantizeTest, PartialBlockIsInvalidArgument) {
  std::vector<uint8_t> block(20);
  std::vector<float> out(40);
  EXPECT_EQ(Dequantize(GgmlType::kQ4_1, block.data(), 40, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvc::worker
