#include "cachesvc/core/block_table.h"

#include "gtest/gtest.h"

namespace kvc::cachesvc {
namespace {

TEST(BlockTableTest, BlocksToGrowCountsOnlyNewBlocks) {
  BlockTable t(/*num_layers=*/2, /*num_kv_heads=*/3, /*block_tokens=*/16);
  EXPECT_EQ(t.BlocksToGrow(0, 1), 1);
  EXPECT_EQ(t.BlocksToGrow(0, 16), 1);
  EXPECT_EQ(t.BlocksToGrow(0, 17), 2);
  EXPECT_EQ(t.BlocksToGrow(15, 1), 0);
  EXPECT_EQ(t.BlocksToGrow(16, 1), 1);
  EXPECT_EQ(t.BlocksToGrow(5, 100), 6);  // 105 tokens need 7 blocks, 1 exists
}

TEST(BlockTableTest, SlotsFollowBlockOrder) {
  BlockTable t(/*num_layers=*/1, /*num_kv_heads=*/2, /*block_tokens=*/4);
  HeadBlocks& h = t.head(0, 1);
  h.blocks = {7, 3, 9};
  h.tokens = 10;
  std::vector<TokenSlot> slots;
  t.Slots(0, 1, 3, 6, &slots);
  ASSERT_EQ(slots.size(), 6u);
  EXPECT_EQ(slots[0].block, 7);
  EXPECT_EQ(slots[0].slot, 3);
  EXPECT_EQ(slots[1].block, 3);
  EXPECT_EQ(slots[1].slot, 0);
  EXPECT_EQ(slots[5].block, 9);
  EXPECT_EQ(slots[5].slot, 0);
  EXPECT_EQ(t.TotalBlocks(), 3);
  EXPECT_EQ(t.TotalStoredTokens(), 10);
  EXPECT_EQ(t.AllBlocks(), (std::vector<BlockId>{7, 3, 9}));
  t.Clear();
  EXPECT_EQ(t.TotalBlocks(), 0);
}

TEST(BlockTableDeathTest, SlotsOutsideStoredTokensAbort) {
  BlockTable t(1, 1, 4);
  t.head(0, 0).blocks = {0};
  t.head(0, 0).tokens = 2;
  std::vector<TokenSlot> slots;
  EXPECT_DEATH(t.Slots(0, 0, 1, 2, &slots), "Check failed");
}

}  // namespace
}  // namespace kvc::cachesvc
