#include "cachesvc/core/host_block_pool.h"

#include <algorithm>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

PoolOptions SmallPool(int64_t blocks) {
  PoolOptions o;
  o.name = "p";
  o.geometry.num_layers = 2;
  o.geometry.num_kv_heads = 2;
  o.geometry.num_query_heads = 2;
  o.geometry.head_dim = 16;
  o.geometry.block_tokens = 4;
  const auto layout = kernels::MakeBlockLayout(StorageFormat::kF16, 16, 4);
  o.capacity_bytes = blocks * static_cast<int64_t>(layout.block_bytes);
  return o;
}

TEST(HostBlockPoolTest, CarvesCapacityIntoWholeBlocks) {
  PoolOptions o = SmallPool(10);
  o.capacity_bytes += 5;  // a partial block is not a block
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o));
  EXPECT_EQ(pool->total_blocks(), 10);
  EXPECT_EQ(pool->free_blocks(), 10);
}

TEST(HostBlockPoolTest, AllocatesDistinctBlocksAndFreesThem) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(8)));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(8, &a));
  EXPECT_EQ(std::set<BlockId>(a.begin(), a.end()).size(), 8u);
  EXPECT_EQ(pool->free_blocks(), 0);
  pool->Free(a);
  EXPECT_EQ(pool->free_blocks(), 8);
}

TEST(HostBlockPoolTest, AllocateIsAllOrNothingWhenFull) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(5)));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(3, &a));
  std::vector<BlockId> b;
  EXPECT_THAT(pool->Allocate(3, &b),
              StatusIs(absl::StatusCode::kResourceExhausted, "pool 'p' is full"));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->free_blocks(), 2);
  KVC_EXPECT_OK(pool->Allocate(2, &b));
}

TEST(HostBlockPoolTest, ReusesMostRecentlyFreedBlockFirst) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4)));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(2, &a));
  pool->Free({a[0]});
  std::vector<BlockId> b;
  KVC_ASSERT_OK(pool->Allocate(1, &b));
  EXPECT_EQ(b[0], a[0]);
}

TEST(HostBlockPoolTest, RejectsInvalidGeometry) {
  PoolOptions o = SmallPool(4);
  o.geometry.head_dim = 20;
  EXPECT_THAT(HostBlockPool::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, "head_dim"));
  o = SmallPool(4);
  o.geometry.num_query_heads = 3;
  EXPECT_THAT(HostBlockPool::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_query_heads"));
  o = SmallPool(4);
  o.capacity_bytes = 10;
  EXPECT_THAT(HostBlockPool::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, "capacity_bytes"));
  o = SmallPool(4);
  o.device = "cuda:0";
  EXPECT_THAT(HostBlockPool::Create(o), StatusIs(absl::StatusCode::kInvalidArgument, "device"));
}

TEST(HostBlockPoolTest, WritesAndReadsTokensExactly) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4)));
  std::vector<BlockId> blocks;
  KVC_ASSERT_OK(pool->Allocate(2, &blocks));
  // 5 tokens of f32 input, stored as f16 (values exactly representable).
  std::vector<float> k(5 * 16), v(5 * 16);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i) * 0.25f;
    v[i] = -static_cast<float>(i);
  }
  std::vector<TokenSlot> slots = {
      {blocks[1], 3}, {blocks[0], 0}, {blocks[0], 1}, {blocks[0], 2}, {blocks[1], 0}};
  std::vector<int32_t> positions = {10, 11, 12, 13, 14};
  pool->WriteTokens(slots, reinterpret_cast<const uint8_t*>(k.data()),
                    reinterpret_cast<const uint8_t*>(v.data()), 16 * 4, DType::kF32, positions);
  std::vector<float> k2(k.size()), v2(v.size());
  std::vector<int32_t> p2(5);
  pool->ReadTokens(slots, DType::kF32, reinterpret_cast<uint8_t*>(k2.data()),
                   reinterpret_cast<uint8_t*>(v2.data()), p2.data());
  EXPECT_EQ(k, k2);
  EXPECT_EQ(v, v2);
  EXPECT_EQ(positions, p2);
}

TEST(HostBlockPoolDeathTest, DoubleFreeAborts) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4)));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(1, &a));
  pool->Free(a);
  EXPECT_DEATH(pool->Free(a), "double free");
}

}  // namespace
}  // namespace kvc::cachesvc
