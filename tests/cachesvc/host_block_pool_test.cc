#include "cachesvc/core/host_block_pool.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using kernels::StorageFormat;
using ::kvc::testing::StatusIs;

constexpr int kDim = 64, kBlockTokens = 4;

int64_t BlockBytes(StorageFormat f) {
  return static_cast<int64_t>(kernels::MakeBlockLayout(f, kDim, kBlockTokens).block_bytes);
}

PoolOptions SmallPool(int64_t f16_blocks) {
  PoolOptions o;
  o.name = "p";
  o.geometry.num_layers = 2;
  o.geometry.num_kv_heads = 2;
  o.geometry.num_query_heads = 2;
  o.geometry.head_dim = kDim;
  o.geometry.block_tokens = kBlockTokens;
  o.capacity_bytes = f16_blocks * BlockBytes(StorageFormat::kF16);
  return o;
}

class HostBlockPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kernels::CreateBackend(kernels::BackendKind::kCpu, {}, &backend_).ok());
  }
  std::unique_ptr<kernels::KernelBackend> backend_;
};

TEST_F(HostBlockPoolTest, AllocatesDistinctBlocksAndFreesThem) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(8), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 8, &a));
  EXPECT_EQ(std::set<BlockId>(a.begin(), a.end()).size(), 8u);
  EXPECT_EQ(pool->used_bytes(), pool->capacity_bytes());
  EXPECT_EQ(pool->used_blocks(StorageFormat::kF16), 8);
  pool->Free(StorageFormat::kF16, a);
  EXPECT_EQ(pool->used_bytes(), 0);
}

TEST_F(HostBlockPoolTest, AllocateIsAllOrNothingWhenFull) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(5), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 3, &a));
  std::vector<BlockId> b;
  EXPECT_THAT(pool->Allocate(StorageFormat::kF16, 3, &b),
              StatusIs(absl::StatusCode::kResourceExhausted, "pool 'p' is full"));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->used_blocks(StorageFormat::kF16), 3);
  KVC_EXPECT_OK(pool->Allocate(StorageFormat::kF16, 2, &b));
}

TEST_F(HostBlockPoolTest, FormatsShareOneByteCapacity) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4), backend_.get()));
  std::vector<BlockId> raw, int4;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 3, &raw));
  // One f16 block of bytes is left: it holds several smaller INT4 blocks.
  const int64_t fit = BlockBytes(StorageFormat::kF16) / BlockBytes(StorageFormat::kInt4G32);
  ASSERT_GE(fit, 2);
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kInt4G32, fit, &int4));
  std::vector<BlockId> more;
  EXPECT_THAT(pool->Allocate(StorageFormat::kInt4G32, 1, &more),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // Freeing raw blocks makes room for the other format at once.
  pool->Free(StorageFormat::kF16, raw);
  KVC_EXPECT_OK(pool->Allocate(StorageFormat::kInt4G32, 1, &more));
  EXPECT_EQ(pool->used_blocks(StorageFormat::kInt4G32), fit + 1);
}

TEST_F(HostBlockPoolTest, ReusesMostRecentlyFreedBlockFirst) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 2, &a));
  pool->Free(StorageFormat::kF16, {a[0]});
  std::vector<BlockId> b;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1, &b));
  EXPECT_EQ(b[0], a[0]);
}

TEST_F(HostBlockPoolTest, RejectsInvalidGeometryAndFormats) {
  PoolOptions o = SmallPool(4);
  o.geometry.head_dim = 20;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "head_dim"));
  o = SmallPool(4);
  o.geometry.num_query_heads = 3;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_query_heads"));
  o = SmallPool(4);
  o.capacity_bytes = 10;
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "capacity_bytes"));
  o = SmallPool(4);
  o.device = "cuda:0";  // a device pool's (DeviceBlockPool)
  EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, "is not host memory"));
  for (const char* device : {"gpu", "cuda", "cuda:", "cuda:x", "cuda:-1", "cuda:1234", "CPU"}) {
    o.device = device;
    EXPECT_THAT(HostBlockPool::Create(o, backend_.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, "is not 'cpu' or 'cuda:N'"))
        << device;
  }
  o = SmallPool(4);
  o.geometry.head_dim = 48;  // INT4 g32 groups cannot tile 48
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(o, backend_.get()));
  std::vector<BlockId> a;
  EXPECT_THAT(pool->Allocate(StorageFormat::kInt4G32, 1, &a),
              StatusIs(absl::StatusCode::kInvalidArgument, "cannot store head_dim 48"));
}

TEST_F(HostBlockPoolTest, DoubleFreeAborts) {
  KVC_ASSERT_OK_AND_ASSIGN(auto pool, HostBlockPool::Create(SmallPool(4), backend_.get()));
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1, &a));
  pool->Free(StorageFormat::kF16, a);
  EXPECT_DEATH(pool->Free(StorageFormat::kF16, a), "double free");
}

}  // namespace
}  // namespace kvc::cachesvc
