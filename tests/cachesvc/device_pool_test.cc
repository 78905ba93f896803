// Device pools: DeviceBlockPool's slab carving, the staging of op arguments (OpStage), the CUDA
// backend's refusal of host pointers, and a host pool beside a device pool in one KvStore.
// Needs a usable CUDA backend: built and run in the cudasim build (a simulated cuda:0, label
// device_sim) and on a GPU by tests/gpu/run_service_gpu.sh; the default build does not
// register it.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cachesvc/core/pool/device_block_pool.h"
#include "cachesvc/core/pool/op_stage.h"
#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::MakeHeadKv;
using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 2, kHeads = 2, kDim = 64, kBlock = 16;

PoolOptions Options(const std::string& name, const std::string& device, int64_t capacity) {
  PoolOptions o;
  o.name = name;
  o.device = device;
  o.capacity_bytes = capacity;
  o.geometry.num_layers = kLayers;
  o.geometry.num_kv_heads = kHeads;
  o.geometry.num_query_heads = 2 * kHeads;
  o.geometry.head_dim = kDim;
  o.geometry.block_tokens = kBlock;
  return o;
}

int64_t BlockBytes(StorageFormat f) {
  return static_cast<int64_t>(kernels::MakeBlockLayout(f, kDim, kBlock).block_bytes);
}

class DevicePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kernels::KernelStatus ks = kernels::CreateBackend(kernels::BackendKind::kCuda, {}, &device_);
    ASSERT_TRUE(ks.ok()) << "this test needs a CUDA device (cudasim build or a GPU): " << ks.detail;
    ks = kernels::CreateBackend(kernels::BackendKind::kCpu, {}, &cpu_);
    ASSERT_TRUE(ks.ok()) << ks.detail;
  }

  std::unique_ptr<DeviceBlockPool> MakePool(int64_t capacity) {
    auto pool =
        DeviceBlockPool::Create(Options("d", "cuda:0", capacity), device_.get(), cpu_.get());
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  std::unique_ptr<kernels::KernelBackend> device_, cpu_;
};

TEST_F(DevicePoolTest, BlocksOfEveryFormatAreDistinctInBoundsAndDisjointInBytes) {
  auto pool = MakePool(int64_t{8} << 20);
  ASSERT_NE(pool, nullptr);
  const char* base = static_cast<const char*>(pool->arena(StorageFormat::kF16).base);
  // Byte ranges of every block handed out, across formats: none may overlap.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<std::pair<StorageFormat, std::vector<BlockId>>> held;
  for (StorageFormat f : {StorageFormat::kF16, StorageFormat::kInt4G32, StorageFormat::kF32,
                          StorageFormat::kInt8, StorageFormat::kNvfp4}) {
    std::vector<BlockId> ids;
    KVC_ASSERT_OK(pool->Allocate(f, 37, &ids));
    const kernels::PagedArena arena = pool->arena(f);
    EXPECT_EQ(arena.base, base) << "every format's arena starts at the allocation";
    for (BlockId id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, arena.num_blocks);
      const int64_t begin = int64_t{id} * BlockBytes(f);
      ASSERT_LE(begin + BlockBytes(f), pool->capacity_bytes());
      ranges.emplace_back(begin, begin + BlockBytes(f));
    }
    EXPECT_EQ(pool->used_blocks(f), 37);
    held.emplace_back(f, ids);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first)
        << "blocks overlap at byte " << ranges[i].first;
  }
  int64_t used = 0;
  for (const auto& [f, ids] : held) used += static_cast<int64_t>(ids.size()) * BlockBytes(f);
  EXPECT_EQ(pool->used_bytes(), used);
  for (const auto& [f, ids] : held) pool->Free(f, ids);
  EXPECT_EQ(pool->used_bytes(), 0);
}

TEST_F(DevicePoolTest, FreedSlabsServeAnotherFormat) {
  // Fill the whole pool with f16, free it, then fill it with INT4: the slabs f16 held must
  // come back to the shared list.
  const int64_t capacity = int64_t{4} << 20;
  auto pool = MakePool(capacity);
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> f16;
  while (pool->Allocate(StorageFormat::kF16, 1, &f16).ok()) {
  }
  EXPECT_GE(static_cast<double>(f16.size()) * static_cast<double>(BlockBytes(StorageFormat::kF16)),
            0.85 * static_cast<double>(capacity))
      << "slab edges waste at most an eighth";
  std::vector<BlockId> int4;
  EXPECT_THAT(pool->Allocate(StorageFormat::kInt4G32, 1, &int4),
              StatusIs(Code::kResourceExhausted, "pool 'd'"));
  pool->Free(StorageFormat::kF16, f16);
  const int64_t want = capacity * 85 / 100 / BlockBytes(StorageFormat::kInt4G32);
  KVC_EXPECT_OK(pool->Allocate(StorageFormat::kInt4G32, want, &int4));
  EXPECT_EQ(std::set<BlockId>(int4.begin(), int4.end()).size(), int4.size());
}

TEST_F(DevicePoolTest, AFailedAllocationTakesNothing) {
  auto pool = MakePool(int64_t{2} << 20);
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> a;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 10, &a));
  const int64_t before = pool->used_bytes();
  std::vector<BlockId> b;
  EXPECT_THAT(pool->Allocate(StorageFormat::kF16, 1 << 20, &b),
              StatusIs(Code::kResourceExhausted, "is full"));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->used_bytes(), before);
  // Everything still allocatable afterwards, and no id is handed out twice.
  std::vector<BlockId> c;
  while (pool->Allocate(StorageFormat::kF16, 1, &c).ok()) {
  }
  std::set<BlockId> all(a.begin(), a.end());
  for (BlockId id : c) EXPECT_TRUE(all.insert(id).second) << "block " << id << " twice";
}

// The CUDA IPC handle opens the whole allocation read-write: it goes only to the one scope
// the pool holds sequences of (its `tenant`, "" where it names none).
TEST_F(DevicePoolTest, TheIpcHandleGoesOnlyToThePoolsTenant) {
  PoolOptions o = Options("d", "cuda:0", int64_t{2} << 20);
  o.tenant = "a";
  KVC_ASSERT_OK_AND_ASSIGN(auto dedicated, DeviceBlockPool::Create(o, device_.get(), cpu_.get()));
  for (const std::string other : {"b", "", "A"}) {
    EXPECT_THAT(dedicated->ShareArena(StorageFormat::kF16, other),
                StatusIs(Code::kFailedPrecondition, "is dedicated to another tenant"))
        << other;
  }
  const absl::StatusOr<SharedArena> mine = dedicated->ShareArena(StorageFormat::kF16, "a");
  // cudasim exports handles of allocations of 1 MiB and more, as a GPU does.
  EXPECT_TRUE(mine.ok()) << mine.status();
  auto shared = MakePool(int64_t{2} << 20);
  ASSERT_NE(shared, nullptr);
  EXPECT_THAT(shared->ShareArena(StorageFormat::kF16, "a"),
              StatusIs(Code::kFailedPrecondition, "holds every tenant's KV in one allocation"));
}

TEST_F(DevicePoolTest, MoreCapacityThanTheDeviceHasIsAStartupError) {
  auto pool = DeviceBlockPool::Create(Options("huge", "cuda:0", int64_t{1} << 50), device_.get(),
                                      cpu_.get());
  EXPECT_THAT(pool.status(),
              StatusIs(Code::kResourceExhausted, "pool 'huge': cannot allocate capacity_bytes"));
}

TEST_F(DevicePoolTest, StagedOpsRoundTripAndTheContextIsReused) {
  auto pool = MakePool(int64_t{4} << 20);
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> blocks;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 2, &blocks));
  const int n = 2 * kBlock;
  const std::string k = MakeHeadKv(3, 0, 0, 0, n, kDim, DType::kF16, /*is_value=*/false);
  const std::string v = MakeHeadKv(3, 0, 0, 0, n, kDim, DType::kF16, /*is_value=*/true);
  std::vector<int32_t> ids, slots;
  for (int i = 0; i < n; ++i) {
    ids.push_back(blocks[static_cast<size_t>(i / kBlock)]);
    slots.push_back(i % kBlock);
  }
  const StagingContext* first = nullptr;
  for (int round = 0; round < 3; ++round) {
    std::string k_out(k.size(), '\0'), v_out(v.size(), '\0');
    {
      OpStage stage(pool.get());
      ASSERT_TRUE(stage.on_device());
      kernels::WriteTokensArgs w;
      w.arena = pool->arena(StorageFormat::kF16);
      w.num_rows = n;
      w.keys = stage.In(k.data(), k.size());
      w.values = stage.In(v.data(), v.size());
      w.dst_blocks = stage.In(ids.data(), ids.size());
      w.dst_slots = stage.In(slots.data(), slots.size());
      KVC_ASSERT_OK(stage.Launch("WriteTokens", [&](kernels::StreamHandle s) {
        return pool->backend()->WriteTokens(w, s);
      }));
      kernels::ReadTokensArgs r;
      r.arena = w.arena;
      r.num_rows = n;
      r.keys = stage.Out(k_out.data(), k_out.size());
      r.values = stage.Out(v_out.data(), v_out.size());
      r.src_blocks = w.dst_blocks;
      r.src_slots = w.dst_slots;
      KVC_ASSERT_OK(stage.Launch("ReadTokens", [&](kernels::StreamHandle s) {
        return pool->backend()->ReadTokens(r, s);
      }));
      KVC_ASSERT_OK(stage.Finish());
    }
    EXPECT_EQ(k_out, k);
    EXPECT_EQ(v_out, v);
    // A step returns its context; the next one gets it back (no new stream or scratch).
    auto context = pool->staging()->Acquire();
    KVC_ASSERT_OK(context.status());
    if (first == nullptr) first = context->get();
    EXPECT_EQ(context->get(), first);
    pool->staging()->Release(*std::move(context));
  }
}

TEST_F(DevicePoolTest, TheCudaBackendRefusesHostPointers) {
  // What catches a core step that forgot to stage an argument: on a GPU it would fault.
  auto pool = MakePool(int64_t{4} << 20);
  ASSERT_NE(pool, nullptr);
  std::vector<BlockId> blocks;
  KVC_ASSERT_OK(pool->Allocate(StorageFormat::kF16, 1, &blocks));
  std::vector<int32_t> ids(4, blocks[0]), slots = {0, 1, 2, 3};
  std::string keys(4 * kDim * 2, '\0');
  OpStage stage(pool.get());
  kernels::ReadTokensArgs r;
  r.arena = pool->arena(StorageFormat::kF16);
  r.num_rows = 4;
  r.keys = stage.Out(keys.data(), keys.size());
  r.src_blocks = ids.data();  // host memory: not staged
  r.src_slots = stage.In(slots.data(), slots.size());
  const kernels::KernelStatus ks = pool->backend()->ReadTokens(r, stage.stream());
  EXPECT_EQ(ks.code, kernels::KernelStatusCode::kInvalidArgument);
  EXPECT_STREQ(ks.detail, "src_blocks is not device memory");
}

TEST(DeviceStoreTest, AHostPoolAndADevicePoolServeTheSameBytes) {
  KvStoreOptions options;
  options.pools.push_back(Options("host", "cpu", int64_t{16} << 20));
  options.pools.push_back(Options("gpu", "cuda:0", int64_t{16} << 20));
  auto store = KvStore::Create(options);
  KVC_ASSERT_OK(store.status());
  std::vector<std::string> fetched;
  for (const char* pool : {"host", "gpu"}) {
    CreateSequenceParams c;
    c.pool = pool;
    auto seq = (*store)->CreateSequence(c);
    KVC_ASSERT_OK(seq.status());
    for (int l = 0; l < kLayers; ++l) {
      const std::string k = MakeKv(7, l, 0, 45, kHeads, kDim, DType::kF16, /*is_value=*/false);
      const std::string v = MakeKv(7, l, 0, 45, kHeads, kDim, DType::kF16, /*is_value=*/true);
      AppendParams a;
      a.sequence_id = seq->id;
      a.layer = l;
      a.num_tokens = 45;
      a.keys = k;
      a.values = v;
      KVC_ASSERT_OK((*store)->Append(a).status());
    }
    // Compress to INT4 with a raw window: conversion, compaction and two tiers on the device.
    CompressParams cp;
    cp.sequence_id = seq->id;
    cp.spec.eviction = CompressionSpec::Eviction::kStreamingLlm;
    cp.spec.sinks = 4;
    cp.spec.window = 24;
    cp.spec.storage = StorageFormat::kInt4G32;
    cp.spec.storage_set = true;
    cp.spec.residual_tokens = 8;
    KVC_ASSERT_OK((*store)->Compress(cp).status());
    FetchParams f;
    f.sequence_id = seq->id;
    std::string all;
    KVC_ASSERT_OK((*store)->Fetch(f, [&](FetchChunk& chunk) {
      all += chunk.keys + chunk.values;
      for (int32_t p : chunk.positions) all += std::to_string(p) + ",";
      return true;
    }));
    fetched.push_back(all);
  }
  EXPECT_FALSE(fetched[0].empty());
  EXPECT_EQ(fetched[0], fetched[1]) << "a device pool must serve what a host pool serves";

  // In-process appends straight from device memory (AppendParams::on_device): only on a
  // device pool, and they store what the same bytes from the host store.
  BlockPool* gpu = *(*store)->leases().FindPool("gpu");
  const std::string k = MakeKv(9, 0, 0, 20, kHeads, kDim, DType::kF16, /*is_value=*/false);
  const std::string v = MakeKv(9, 0, 0, 20, kHeads, kDim, DType::kF16, /*is_value=*/true);
  void* dev = nullptr;
  ASSERT_TRUE(gpu->backend()->Allocate(2 * k.size(), &dev).ok());
  ASSERT_TRUE(gpu->backend()->CopyToDevice(dev, k.data(), k.size(), {}).ok());
  ASSERT_TRUE(gpu->backend()
                  ->CopyToDevice(static_cast<char*>(dev) + k.size(), v.data(), v.size(), {})
                  .ok());
  ASSERT_TRUE(gpu->backend()->Synchronize({}).ok());
  std::vector<std::string> ids;
  for (const char* pool : {"host", "gpu"}) {
    CreateSequenceParams c;
    c.pool = pool;
    auto seq = (*store)->CreateSequence(c);
    KVC_ASSERT_OK(seq.status());
    ids.push_back(seq->id);
  }
  AppendParams a;
  a.layer = 0;
  a.num_tokens = 20;
  a.keys = absl::string_view(static_cast<const char*>(dev), k.size());
  a.values = absl::string_view(static_cast<const char*>(dev) + k.size(), v.size());
  a.on_device = true;
  a.sequence_id = ids[0];
  EXPECT_THAT((*store)->Append(a).status(), StatusIs(Code::kInvalidArgument, "is on the host"));
  a.sequence_id = ids[1];
  a.device = "cuda:1";  // memory of another device (an NCCL transfer of a pool there)
  EXPECT_THAT((*store)->Append(a).status(),
              StatusIs(Code::kFailedPrecondition, "keys and values are on cuda:1"));
  a.device = "cuda:0";
  KVC_ASSERT_OK((*store)->Append(a).status());
  FetchParams f;
  f.sequence_id = ids[1];
  f.include_unfinished = true;
  std::string got_k, got_v;
  KVC_ASSERT_OK((*store)->Fetch(f, [&](FetchChunk& chunk) {
    got_k += chunk.keys;
    got_v += chunk.values;
    return true;
  }));
  EXPECT_EQ(got_k, MakeHeadKv(9, 0, 0, 0, 20, kDim, DType::kF16, /*is_value=*/false) +
                       MakeHeadKv(9, 0, 1, 0, 20, kDim, DType::kF16, /*is_value=*/false));
  EXPECT_EQ(got_v, MakeHeadKv(9, 0, 0, 0, 20, kDim, DType::kF16, /*is_value=*/true) +
                       MakeHeadKv(9, 0, 1, 0, 20, kDim, DType::kF16, /*is_value=*/true));
  gpu->backend()->Free(dev);
  auto pools = (*store)->stats().ListPools();
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[1].options.device, "cuda:0");
}

}  // namespace
}  // namespace kvc::cachesvc
