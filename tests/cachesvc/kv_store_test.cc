#include "cachesvc/core/store/kv_store.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::MakeHeadKv;
using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 3, kHeads = 2, kDim = 32, kBlock = 16;

KvStoreOptions SmallStore(int64_t blocks = 1000) {
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.name = "p";
  pool.geometry.num_layers = kLayers;
  pool.geometry.num_kv_heads = kHeads;
  pool.geometry.num_query_heads = 2 * kHeads;
  pool.geometry.head_dim = kDim;
  pool.geometry.block_tokens = kBlock;
  pool.capacity_bytes =
      blocks *
      static_cast<int64_t>(kernels::MakeBlockLayout(StorageFormat::kF16, kDim, kBlock).block_bytes);
  KvStoreOptions options;
  options.pools.push_back(pool);
  return options;
}

struct Payload {
  std::string keys, values;
};

Payload MakePayload(int layer, int64_t start, int n, DType dtype = DType::kF16, uint32_t seed = 1) {
  return {MakeKv(seed, layer, start, n, kHeads, kDim, dtype, /*is_value=*/false),
          MakeKv(seed, layer, start, n, kHeads, kDim, dtype, /*is_value=*/true)};
}

AppendParams Params(const std::string& id, int layer, int64_t start, int n, const Payload& p) {
  AppendParams a;
  a.sequence_id = id;
  a.layer = layer;
  a.start_position = start;
  a.num_tokens = n;
  a.keys = p.keys;
  a.values = p.values;
  return a;
}

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = KvStore::Create(SmallStore());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto seq = store_->CreateSequence({});
    ASSERT_TRUE(seq.ok());
    id_ = seq->id;
  }

  void AppendAllLayers(int64_t start, int n) {
    for (int l = 0; l < kLayers; ++l) {
      const Payload p = MakePayload(l, start, n);
      KVC_ASSERT_OK(store_->Append(Params(id_, l, start, n, p)));
    }
  }

  std::vector<FetchChunk> FetchAll(FetchParams params) {
    params.sequence_id = id_;
    std::vector<FetchChunk> chunks;
    EXPECT_THAT(store_->Fetch(params,
                              [&](FetchChunk& c) {
                                chunks.push_back(c);
                                return true;
                              }),
                ::kvc::testing::IsOk());
    return chunks;
  }

  std::unique_ptr<KvStore> store_;
  std::string id_;
};

TEST_F(KvStoreTest, FetchReturnsExactlyWhatWasAppended) {
  AppendAllLayers(0, 20);
  AppendAllLayers(20, 13);
  FetchParams params;
  const auto chunks = FetchAll(params);
  ASSERT_EQ(chunks.size(), static_cast<size_t>(kLayers * kHeads));
  for (const FetchChunk& c : chunks) {
    EXPECT_EQ(c.num_tokens, 33);
    EXPECT_EQ(c.keys,
              MakeHeadKv(1, c.layer, c.kv_head, 0, 33, kDim, DType::kF16, /*is_value=*/false));
    EXPECT_EQ(c.values,
              MakeHeadKv(1, c.layer, c.kv_head, 0, 33, kDim, DType::kF16, /*is_value=*/true));
    for (int i = 0; i < 33; ++i) EXPECT_EQ(c.positions[static_cast<size_t>(i)], i);
  }
  EXPECT_TRUE(chunks.back().last);
}

TEST_F(KvStoreTest, TokensBecomeVisibleOnlyWhenEveryLayerHasThem) {
  AppendAllLayers(0, 8);
  const Payload p = MakePayload(0, 8, 4);
  KVC_ASSERT_OK_AND_ASSIGN(AppendResult r, store_->Append(Params(id_, 0, 8, 4, p)));
  EXPECT_EQ(r.layer_tokens, 12);
  EXPECT_EQ(r.visible_tokens, 8);
  for (const FetchChunk& c : FetchAll({})) EXPECT_EQ(c.num_tokens, 8);
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, store_->GetSequence(id_));
  EXPECT_EQ(s.visible_tokens, 8);
  EXPECT_EQ(s.layer_tokens, (std::vector<int64_t>{12, 8, 8}));
}

TEST_F(KvStoreTest, ConvertsDtypesOnWriteAndRead) {
  for (int l = 0; l < kLayers; ++l) {
    const Payload p = MakePayload(l, 0, 5, DType::kF32);
    AppendParams a = Params(id_, l, 0, 5, p);
    a.dtype = DType::kF32;
    KVC_ASSERT_OK(store_->Append(a));
  }
  FetchParams params;
  params.dtype = DType::kBF16;
  for (const FetchChunk& c : FetchAll(params)) {
    EXPECT_EQ(c.dtype, DType::kBF16);
    EXPECT_EQ(c.keys,
              MakeHeadKv(1, c.layer, c.kv_head, 0, 5, kDim, DType::kBF16, /*is_value=*/false));
  }
}

TEST_F(KvStoreTest, StoredFormatReturnsRawRecords) {
  AppendAllLayers(0, 3);
  FetchParams params;
  params.format = FetchFormat::kStored;
  params.layers = {1};
  const auto chunks = FetchAll(params);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].record_bytes, kDim * 2);
  EXPECT_EQ(chunks[0].storage, StorageFormat::kF16);
  EXPECT_EQ(chunks[0].keys, MakeHeadKv(1, 1, 0, 0, 3, kDim, DType::kF16, /*is_value=*/false));
}

TEST_F(KvStoreTest, ChunksStayBelowTheRequestedSize) {
  AppendAllLayers(0, 200);
  FetchParams params;
  params.max_chunk_bytes = 4096;  // 4096 / (2 * 64 bytes per token) = 32 tokens per chunk
  const auto chunks = FetchAll(params);
  EXPECT_EQ(chunks.size(), static_cast<size_t>(kLayers * kHeads * 7));  // ceil(200 / 32)
  for (const FetchChunk& c : chunks) {
    EXPECT_LE(c.keys.size() + c.values.size(), 4096u);
  }
}

TEST_F(KvStoreTest, RejectsBadAppendsWithoutChangingAnything) {
  AppendAllLayers(0, 4);
  const Payload p = MakePayload(0, 4, 2);
  AppendParams a = Params(id_, 0, 4, 2, p);
  a.layer = kLayers;
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kInvalidArgument, "layer 3 is out of range"));
  a = Params(id_, 0, 4, 0, p);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kInvalidArgument, "num_tokens is 0"));
  a = Params(id_, 0, 4, 3, p);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kInvalidArgument, "keys has 256 bytes; expected"));
  a = Params(id_, 0, -1, 2, p);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kInvalidArgument, "start_position is -1"));
  a = Params(id_, 0, 7, 2, p);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kFailedPrecondition, "must start at 4"));
  a = Params(id_, 0, 4, 2, p);
  a.values = absl::string_view(p.values.data(), 10);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kInvalidArgument, "values has 10 bytes"));
  a = Params("nope", 0, 4, 2, p);
  EXPECT_THAT(store_->Append(a), StatusIs(Code::kNotFound, "'nope' not found"));
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot s, store_->GetSequence(id_));
  EXPECT_EQ(s.layer_tokens, (std::vector<int64_t>{4, 4, 4}));
}

TEST(KvStoreFullTest, PoolFullFailsWholeAppendAndKeepsBlocks) {
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(SmallStore(/*blocks=*/5)));
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot seq, store->CreateSequence({}));
  // 16 tokens need one block per head = 2 blocks; 48 tokens would need 6.
  const Payload small = MakePayload(0, 0, 16);
  KVC_ASSERT_OK(store->Append(Params(seq.id, 0, 0, 16, small)));
  const Payload big = MakePayload(1, 0, 48);
  EXPECT_THAT(store->Append(Params(seq.id, 1, 0, 48, big)),
              StatusIs(Code::kResourceExhausted, "needs 6 f16 blocks"));
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot stats, store->stats().GetPoolStats("p"));
  EXPECT_EQ(stats.used_blocks, 2);
  KVC_ASSERT_OK_AND_ASSIGN(SequenceSnapshot after, store->GetSequence(seq.id));
  EXPECT_EQ(after.layer_tokens[1], 0);
}

// A pool whose config names a tenant holds that scope's sequences only (what lets a device
// pool share its one allocation with that tenant's engines over CUDA IPC).
TEST(KvStoreTenantPoolTest, APoolDedicatedToATenantHoldsOnlyItsSequences) {
  KvStoreOptions options = SmallStore();
  options.pools[0].tenant = "a";
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(options));
  CreateSequenceParams b;
  b.tenant = "b";
  b.scope = TenantScope(b.tenant);
  EXPECT_THAT(store->CreateSequence(b),
              StatusIs(Code::kPermissionDenied, "holds one other tenant's sequences only"));
  EXPECT_THAT(store->CreateSequence({}), StatusIs(Code::kPermissionDenied));
  CreateSequenceParams a;
  a.tenant = "a";
  a.scope = TenantScope(a.tenant);
  KVC_EXPECT_OK(store->CreateSequence(a).status());
}

TEST_F(KvStoreTest, ReleaseReturnsEveryBlock) {
  AppendAllLayers(0, 40);  // 3 blocks x 2 heads x 3 layers
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot before, store_->stats().GetPoolStats(""));
  EXPECT_EQ(before.used_blocks, 18);
  KVC_ASSERT_OK_AND_ASSIGN(ReleaseResult r, store_->Release(id_));
  EXPECT_EQ(r.freed_blocks, 18);
  KVC_ASSERT_OK_AND_ASSIGN(PoolStatsSnapshot after, store_->stats().GetPoolStats(""));
  EXPECT_EQ(after.used_blocks, 0);
  EXPECT_EQ(after.sequences, 0);
  EXPECT_THAT(store_->Release(id_), StatusIs(Code::kNotFound));
  EXPECT_THAT(store_->GetSequence(id_), StatusIs(Code::kNotFound));
}

TEST_F(KvStoreTest, CreateValidatesItsArguments) {
  CreateSequenceParams p;
  p.pool = "missing";
  EXPECT_THAT(store_->CreateSequence(p), StatusIs(Code::kNotFound, "this server has: p"));
  p = {};
  p.client_sequence_id = "has space";
  EXPECT_THAT(store_->CreateSequence(p), StatusIs(Code::kInvalidArgument, "client_sequence_id"));
  p.client_sequence_id = "mine";
  KVC_ASSERT_OK(store_->CreateSequence(p));
  EXPECT_THAT(store_->CreateSequence(p), StatusIs(Code::kAlreadyExists, "'mine' already exists"));
  p.client_sequence_id = "";
  p.policy.eviction = CompressionSpec::Eviction::kSnapKv;
  p.policy.window = 4;
  p.policy.budget = 8;
  EXPECT_THAT(store_->CreateSequence(p),
              StatusIs(Code::kInvalidArgument, "cannot be an automatic policy"));
}

TEST_F(KvStoreTest, FetchAbortsWhenReleasedMidStream) {
  AppendAllLayers(0, 64);
  FetchParams params;
  params.sequence_id = id_;
  params.max_chunk_bytes = 4096;
  int seen = 0;
  const absl::Status status = store_->Fetch(params, [&](FetchChunk&) {
    if (++seen == 2) {
      EXPECT_THAT(store_->Release(id_), ::kvc::testing::IsOk());
    }
    return true;
  });
  EXPECT_THAT(status, StatusIs(Code::kAborted, "released or compressed"));
  EXPECT_EQ(seen, 2);
}

TEST_F(KvStoreTest, ConcurrentSequencesDoNotInterfere) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto seq = store_->CreateSequence({});
      if (!seq.ok()) {
        results[static_cast<size_t>(t)] = seq.status();
        return;
      }
      for (int step = 0; step < 10; ++step) {
        for (int l = 0; l < kLayers; ++l) {
          const Payload p = MakePayload(l, step * 7, 7, DType::kF16, /*seed=*/100 + t);
          auto r = store_->Append(Params(seq->id, l, step * 7, 7, p));
          if (!r.ok()) {
            results[static_cast<size_t>(t)] = r.status();
            return;
          }
        }
        FetchParams f;
        f.sequence_id = seq->id;
        absl::Status st = store_->Fetch(f, [&](FetchChunk& c) {
          if (c.keys != MakeHeadKv(100 + t, c.layer, c.kv_head, 0, (step + 1) * 7, kDim,
                                   DType::kF16, /*is_value=*/false)) {
            results[static_cast<size_t>(t)] = absl::InternalError("wrong data");
          }
          return true;
        });
        if (!st.ok()) results[static_cast<size_t>(t)] = st;
      }
      results[static_cast<size_t>(t)].Update(store_->Release(seq->id).status());
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) KVC_EXPECT_OK(r);
}

}  // namespace
}  // namespace kvc::cachesvc

namespace kvc::cachesvc {
namespace {

// A response must fit one message: Attend checks the size it would build (output and, with
// weights, n x query heads x stored tokens floats) before doing any work, and says what to
// ask for instead; the sequence's scores are untouched by the refused call.
TEST(KvStoreLimitsTest, AttendRefusesAResponseLargerThanTheLimitBeforeWorking) {
  KvStoreOptions options = SmallStore();
  options.max_response_bytes = 64 << 10;
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(options));
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot seq, store->CreateSequence({}));
  constexpr int kTokens = 900;
  for (int l = 0; l < kLayers; ++l) {
    const Payload p = MakePayload(l, 0, kTokens);
    KVC_ASSERT_OK(store->Append(Params(seq.id, l, 0, kTokens, p)).status());
  }
  const int n = 8;
  std::vector<float> q(static_cast<size_t>(n) * 2 * kHeads * kDim, 0.25f);
  AttendParams a;
  a.sequence_id = seq.id;
  a.dtype = DType::kF32;
  a.queries = absl::string_view(reinterpret_cast<const char*>(q.data()), q.size() * 4);
  for (int i = 0; i < n; ++i) a.positions.push_back(kTokens + i);
  a.want_weights = true;  // 8 x 4 query heads x 900 x 4 bytes = 115,200 bytes of weights
  EXPECT_THAT(store->Attend(a), StatusIs(Code::kResourceExhausted, "at most 65536"));
  EXPECT_THAT(store->Attend(a), StatusIs(Code::kResourceExhausted, "return_weights false"));
  a.want_weights = false;  // 8 x 4 x 32 x 4 bytes of output: fits
  KVC_ASSERT_OK_AND_ASSIGN(const AttendResult r, store->Attend(a));
  EXPECT_EQ(r.output.size(), q.size() * 4);
  EXPECT_TRUE(r.weights.empty());
}

}  // namespace
}  // namespace kvc::cachesvc
