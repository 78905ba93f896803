// The payload rule every transfer reader and sender shares (transfer/payload.h): where each
// format's blocks lie, the pieces they are sent in, and what it refuses.
#include "transfer/payload.h"

#include <array>
#include <vector>

#include "gtest/gtest.h"

namespace kvc::transfer {
namespace {

using Counts = std::array<int64_t, kMaxFormats>;

TEST(PayloadTest, FormatsFollowEachOtherInNumberOrder) {
  Counts blocks{}, bytes{};
  blocks[2] = 3;  // f16: 3 blocks of 4 KiB
  bytes[2] = 4096;
  blocks[6] = 5;  // INT4 g32: 5 blocks of 1152 bytes
  bytes[6] = 1152;
  bytes[7] = 999;  // a format without blocks takes no room
  const absl::StatusOr<PayloadLayout> layout = PayloadLayout::Make(blocks, bytes);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->offset(2), 0);
  EXPECT_EQ(layout->bytes(2), 3 * 4096);
  EXPECT_EQ(layout->offset(6), 3 * 4096);
  EXPECT_EQ(layout->bytes(6), 5 * 1152);
  EXPECT_EQ(layout->bytes(7), 0);
  EXPECT_EQ(layout->total_bytes(), 3 * 4096 + 5 * 1152);
  EXPECT_EQ(layout->total_blocks(), 8);
}

TEST(PayloadTest, PiecesAreRunsOfFourMiBPerFormatTheLastShorter) {
  Counts blocks{}, bytes{};
  blocks[1] = 2500;  // f32 blocks of 4 KiB: 1024 per piece
  bytes[1] = 4096;
  blocks[8] = 1;  // one block larger than a piece: a piece of its own
  bytes[8] = int64_t{6} << 20;
  const absl::StatusOr<PayloadLayout> layout = PayloadLayout::Make(blocks, bytes);
  ASSERT_TRUE(layout.ok());
  const std::vector<Piece> pieces = layout->Pieces();
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].blocks, 1024);
  EXPECT_EQ(pieces[1].first_block, 1024);
  EXPECT_EQ(pieces[2].blocks, 2500 - 2048);
  EXPECT_EQ(pieces[2].offset, 2048 * 4096);
  EXPECT_EQ(pieces[3].format, 8);
  EXPECT_EQ(pieces[3].offset, 2500 * 4096);
  EXPECT_EQ(pieces[3].bytes, int64_t{6} << 20);
  int64_t sum = 0;
  for (const Piece& p : pieces) sum += p.bytes;
  EXPECT_EQ(sum, layout->total_bytes());
  EXPECT_EQ(layout->largest_piece(), int64_t{6} << 20);
  EXPECT_EQ(PieceBlocks(4096), 1024u);
  EXPECT_EQ(PieceBlocks(size_t{8} << 20), 1u);
}

TEST(PayloadTest, NumberingCountsEachFormatApartAndRefusesUnknownOnes) {
  PayloadNumbering n;
  EXPECT_EQ(*n.Next(2), 0);
  EXPECT_EQ(*n.Next(6), 0);
  EXPECT_EQ(*n.Next(2), 1);
  EXPECT_EQ(n.count(2), 2);
  EXPECT_FALSE(n.Next(0).ok());
  EXPECT_FALSE(n.Next(kMaxFormats).ok());
  Counts blocks{}, bytes{};
  blocks[3] = 1;  // blocks without a size
  EXPECT_FALSE(PayloadLayout::Make(blocks, bytes).ok());
  bytes[3] = int64_t{1} << 62;
  blocks[3] = 8;  // overflows
  EXPECT_FALSE(PayloadLayout::Make(blocks, bytes).ok());
}

}  // namespace
}  // namespace kvc::transfer
