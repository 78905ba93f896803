// The prefix cache through the store: a published prefix attached by later sequences shares
// its blocks (pool bytes ~ one copy) and serves the same bytes; every mutation of one sharer
// copies before it writes, so the others' Fetch stays byte-identical; released prefixes stay
// cached until a live allocation needs their room; a corrupted block, another salt, model,
// tenant or format is never served; holders return to zero and the pool to empty.
#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "cachesvc/core/store/kv_store.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/cachesvc/stored_dump.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

constexpr int kTokens = 100;  // 6 whole blocks of 16 + 4

std::vector<int32_t> TokenIds(int n, int seed = 1) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 49152);
  return ids;
}

PrefixSpec Prefix(const std::vector<int32_t>& ids, const std::string& salt = "",
                  const std::string& model = "smollm2-135m") {
  return PrefixSpec{model, salt, ids};
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  // A publishes its first kTokens; returns its id.
  void SetUp() override {
    a_.emplace(Geometry{}, CompressionSpec{});
    KVC_ASSERT_OK(a_->AppendAll(0, kTokens));
    auto published =
        store().prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a_->id, Prefix(ids_)});
    KVC_ASSERT_OK(published);
    EXPECT_EQ(published->published_tokens, 96);
    EXPECT_EQ(published->new_tokens, 96);
  }
  KvStore& store() { return *a_->store; }
  int64_t Used() { return store().stats().ListPools()[0].used_bytes; }
  absl::StatusOr<SequenceSnapshot> CreateWith(const PrefixSpec& prefix,
                                              CompressionSpec policy = {}) {
    CreateSequenceParams p;
    p.policy = policy;
    p.prefix = prefix;
    return store().CreateSequence(p);
  }
  // Appends tokens [from, to) of A's data to `id` (A's Gaussians are seeded by start).
  void AppendLikeA(const std::string& id, int64_t from, int64_t n) {
    const std::string saved = a_->id;
    a_->id = id;
    KVC_EXPECT_OK(a_->AppendAll(from, n));
    a_->id = saved;
  }

  std::vector<int32_t> ids_ = TokenIds(kTokens);
  std::optional<Fixture> a_;
};

TEST_F(PrefixCacheTest, AttachSharesTheBlocksAndServesTheSameBytes) {
  const int64_t used = Used();
  auto b = CreateWith(Prefix(ids_));
  KVC_ASSERT_OK(b);
  EXPECT_EQ(b->attached_tokens, 96);
  EXPECT_EQ(b->visible_tokens, 96);
  EXPECT_EQ(Used(), used) << "attaching copies nothing";
  // B's 96 tokens are A's first 96, byte for byte, on every lane.
  EXPECT_EQ(Read(store(), b->id), Read(store(), a_->id, 96));
  EXPECT_EQ(Read(store(), b->id).chunks.size(), 4u);
  AppendLikeA(b->id, 96, 20);
  EXPECT_EQ(Read(store(), b->id, 96), Read(store(), a_->id, 96));
  EXPECT_EQ(Used(), used + 2 * 4 * 8192) << "B's own 20 tokens: 2 blocks per lane";
  const PrefixStats s = *store().stats().PrefixCacheStats("");
  EXPECT_EQ(s.attached_tokens, 96);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.entries, 6);
}

TEST_F(PrefixCacheTest, LookupCountsWholeCachedBlocksOnly) {
  LookupPrefixParams p;
  p.prefix = Prefix(ids_);
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 96);
  p.prefix.token_ids.resize(40);
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 32);
  p.prefix.token_ids = ids_;
  p.prefix.token_ids[50] += 1;  // block 3 differs: blocks 0-2 still match, nothing after
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 48);
}

TEST_F(PrefixCacheTest, OtherSaltModelTenantOrFormatNeverHits) {
  LookupPrefixParams p;
  p.prefix = Prefix(ids_, "other-salt");
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 0);
  p.prefix = Prefix(ids_, "", "llama-3-8b");
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 0);
  p.prefix = Prefix(ids_);
  p.scope = TenantScope("tenant-b");
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 0);
  p.scope = TenantScope();
  p.format = StorageFormat::kInt8;
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 0);
  // A sequence storing INT8 attaches nothing of A's f32 blocks.
  CompressionSpec int8;
  int8.storage = StorageFormat::kInt8;
  int8.storage_set = true;
  auto b = CreateWith(Prefix(ids_), int8);
  KVC_ASSERT_OK(b);
  EXPECT_EQ(b->attached_tokens, 0);
  auto c = CreateWith(Prefix(ids_, "x"));
  KVC_ASSERT_OK(c);
  EXPECT_EQ(c->attached_tokens, 0);
}

// A document stored in INT4 from its first token (a query-agnostic compression) is cached and
// attached like an f16 one, by sequences that store INT4 too.
TEST(PrefixCacheFormatTest, AnInt4DocumentIsPublishedAndAttached) {
  CompressionSpec int4;
  int4.storage = StorageFormat::kInt4G32;
  int4.storage_set = true;
  Fixture a(Geometry{}, int4);
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  const std::vector<int32_t> ids = TokenIds(kTokens);
  KVC_ASSERT_OK_AND_ASSIGN(
      const PublishPrefixResult published,
      a.store->prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a.id, Prefix(ids)}));
  EXPECT_EQ(published.new_tokens, 96);
  const int64_t used = a.store->stats().ListPools()[0].used_bytes;
  CreateSequenceParams p;
  p.policy = int4;
  p.prefix = Prefix(ids);
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, a.store->CreateSequence(p));
  EXPECT_EQ(b.attached_tokens, 96);
  EXPECT_EQ(b.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(a.store->stats().ListPools()[0].used_bytes, used) << "attaching copies nothing";
  EXPECT_EQ(Read(*a.store, b.id), Read(*a.store, a.id, 96));
}

// Every mutation of one sharer leaves the other's bytes as they were.
TEST_F(PrefixCacheTest, EveryMutationCopiesOnWrite) {
  struct Case {
    const char* name;
    std::function<absl::Status(KvStore&, const std::string&)> mutate;
  };
  auto compress = [](CompressionSpec spec) {
    return [spec](KvStore& s, const std::string& id) {
      CompressParams p;
      p.sequence_id = id;
      p.spec = spec;
      return s.Compress(p).status();
    };
  };
  CompressionSpec int4;
  int4.storage = StorageFormat::kInt4G32;
  int4.storage_set = true;
  CompressionSpec h2o;
  h2o.eviction = Eviction::kH2o;
  h2o.heavy = 24;
  h2o.recent = 8;
  const std::vector<Case> cases = {
      {"streaming (evicts, compacts, re-rotates)", compress(Streaming(4, 20))},
      {"streaming 4+60 (holes inside shared blocks)", compress(Streaming(4, 60))},
      {"int4 conversion", compress(int4)},
      {"h2o after attend",
       [&](KvStore& s, const std::string& id) {
         AttendParams at;
         at.sequence_id = id;
         at.dtype = DType::kF32;
         const std::vector<float> q = Gaussian(4 * 64, 9);
         at.queries = Bytes(q);
         at.positions = {120};
         KVC_RETURN_IF_ERROR(s.Attend(at).status());
         return compress(h2o)(s, id);
       }},
      {"append",
       [&](KvStore&, const std::string& id) {
         AppendLikeA(id, 96, 30);
         return absl::OkStatus();
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto b = CreateWith(Prefix(ids_));
    KVC_ASSERT_OK(b);
    auto d = CreateWith(Prefix(ids_));
    KVC_ASSERT_OK(d);
    const Dump a_before = Read(store(), a_->id), d_before = Read(store(), d->id);
    KVC_ASSERT_OK(c.mutate(store(), b->id));
    EXPECT_EQ(Read(store(), a_->id), a_before) << "the publisher changed";
    EXPECT_EQ(Read(store(), d->id), d_before) << "another sharer changed";
    // And the other way round: the publisher mutates, the sharer stays.
    KVC_ASSERT_OK(store().Release(b->id));
    KVC_ASSERT_OK(store().Release(d->id));
  }
  auto e = CreateWith(Prefix(ids_));
  KVC_ASSERT_OK(e);
  EXPECT_EQ(e->attached_tokens, 96) << "the cached prefix survived every sharer's mutation";
  const Dump e_before = Read(store(), e->id);
  KVC_ASSERT_OK(compress(Streaming(2, 10))(store(), a_->id));
  EXPECT_EQ(Read(store(), e->id), e_before);
}

TEST_F(PrefixCacheTest, ReleasedPrefixStaysCachedUntilAllocationNeedsTheRoom) {
  const int64_t used = Used();
  KVC_ASSERT_OK(store().Release(a_->id));
  PrefixStats s = *store().stats().PrefixCacheStats("c");
  EXPECT_EQ(s.entries, 6);
  EXPECT_EQ(s.unreferenced_bytes, s.cached_bytes);
  EXPECT_GT(Used(), 0);
  EXPECT_LT(Used(), used) << "A's unpublished tail block went back";
  auto b = CreateWith(Prefix(ids_));
  KVC_ASSERT_OK(b);
  EXPECT_EQ(b->attached_tokens, 96) << "a released prefix is still a hit";
  s = *store().stats().PrefixCacheStats("c");
  EXPECT_EQ(s.unreferenced_bytes, 0);
  KVC_ASSERT_OK(store().Release(b->id));
}

TEST(PrefixCacheCapacityTest, CachedBlocksGiveWayToLiveAllocations) {
  // A pool that holds 2 x 100 tokens, not 3.
  const Geometry g;
  const int64_t per_seq = int64_t{7} * g.layers * g.heads * 2 * 16 * 64 * 4;
  Fixture a(g, {}, per_seq * 5 / 2);
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  KVC_ASSERT_OK(a.store->prefixes().PublishPrefix(
      PublishPrefixParams{TenantScope(), a.id, Prefix(TokenIds(kTokens))}));
  KVC_ASSERT_OK(a.store->Release(a.id));
  for (int i = 0; i < 2; ++i) {
    auto s = a.store->CreateSequence({});
    KVC_ASSERT_OK(s);
    a.id = s->id;
    KVC_ASSERT_OK(a.AppendAll(0, kTokens)) << "sequence " << i;
  }
  const PrefixStats s = *a.store->stats().PrefixCacheStats("");
  EXPECT_GT(s.evicted_entries, 0);
  EXPECT_LT(s.entries, 6);
}

// A lookup that matches nothing because its prefix was evicted is counted as such; one that
// never was cached is not.
TEST(PrefixCacheCapacityTest, ALookupOfAnEvictedPrefixSaysSo) {
  // A pool of exactly one 100-token sequence: the next one needs all of the cache's room.
  const Geometry g;
  const int64_t per_seq = int64_t{7} * g.layers * g.heads * 2 * 16 * 64 * 4;
  Fixture a(g, {}, per_seq);
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  const std::vector<int32_t> ids = TokenIds(kTokens);
  KVC_ASSERT_OK(
      a.store->prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a.id, Prefix(ids)}));
  KVC_ASSERT_OK(a.store->Release(a.id));
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, a.store->CreateSequence({}));
  a.id = b.id;
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  PrefixStats s = *a.store->stats().PrefixCacheStats("");
  ASSERT_EQ(s.evicted_entries, 6);
  EXPECT_EQ(s.evicted_misses, 0);
  LookupPrefixParams p;
  p.prefix = Prefix(ids);
  EXPECT_EQ(a.store->prefixes().LookupPrefix(p)->cached_tokens, 0);
  p.prefix = Prefix(TokenIds(kTokens, /*seed=*/2));
  EXPECT_EQ(a.store->prefixes().LookupPrefix(p)->cached_tokens, 0);
  s = *a.store->stats().PrefixCacheStats("");
  EXPECT_EQ(s.lookups - s.hits, 2);
  EXPECT_EQ(s.evicted_misses, 1) << "only the first was cached once";
}

TEST_F(PrefixCacheTest, CorruptBlockIsAMissNeverServed) {
  // Flip one byte of the first block A wrote (lane 0, tokens 0-15: entry 0), through the
  // pool's backend so a device pool works the same.
  BlockPool* pool = *store().leases().FindPool("");
  const kernels::PagedArena arena = pool->arena(StorageFormat::kF32);
  ASSERT_TRUE(pool->backend()
                  ->Memset(static_cast<char*>(arena.base) + 100, 0x5a, 1, kernels::StreamHandle{})
                  .ok());
  ASSERT_TRUE(pool->backend()->Synchronize(kernels::StreamHandle{}).ok());
  auto b = CreateWith(Prefix(ids_));
  KVC_ASSERT_OK(b);
  EXPECT_EQ(b->attached_tokens, 0);
  const PrefixStats s = *store().stats().PrefixCacheStats("");
  EXPECT_EQ(s.checksum_misses, 1);
  EXPECT_EQ(s.entries, 5) << "the corrupt entry left the index";
  LookupPrefixParams p;
  p.prefix = Prefix(ids_);
  EXPECT_EQ(store().prefixes().LookupPrefix(p)->cached_tokens, 0);
}

TEST(PrefixCacheQuotaTest, AttachIsChargedToTheTenantAndRefusedOverQuota) {
  const Geometry g;
  KvStoreOptions o = Options(g);
  // 6 blocks x 4 lanes of f32 (16 x 64 x 4 x 2 bytes each) = 196608 bytes attached.
  o.quotas.push_back(TenantQuota{"small", 100000, 0});
  auto store = KvStore::Create(o);
  KVC_ASSERT_OK(store);
  Fixture a(g);
  a.store = std::move(*store);
  auto s = a.store->CreateSequence({});
  KVC_ASSERT_OK(s);
  a.id = s->id;
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  const std::vector<int32_t> ids = TokenIds(kTokens);
  KVC_ASSERT_OK(
      a.store->prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a.id, Prefix(ids)}));
  const int64_t used = a.store->stats().ListPools()[0].used_bytes;
  CreateSequenceParams p;
  p.prefix = Prefix(ids);
  p.tenant = "big";
  auto big = a.store->CreateSequence(p);
  KVC_ASSERT_OK(big);
  EXPECT_EQ(big->attached_tokens, 96);
  EXPECT_EQ(big->bytes, 196608) << "a sharer holds (and pays for) what it attached";
  EXPECT_EQ(a.store->stats().TenantPoolStats("big", "")->used_bytes, 196608);
  p.tenant = "small";
  EXPECT_THAT(a.store->CreateSequence(p), StatusIs(absl::StatusCode::kResourceExhausted, "quota"));
  EXPECT_EQ(a.store->stats().ListPools()[0].used_bytes, used);
  EXPECT_EQ(a.store->stats().TenantPoolStats("small", "")->used_bytes, 0);
  KVC_ASSERT_OK(a.store->Release(big->id));
  KVC_ASSERT_OK(a.store->Release(a.id));
  const PrefixStats st = *a.store->stats().PrefixCacheStats("");
  EXPECT_EQ(st.unreferenced_bytes, st.cached_bytes) << "the refused attach let go of its holds";
}

TEST_F(PrefixCacheTest, BadPrefixRequestsNameTheField) {
  EXPECT_THAT(CreateWith(Prefix(ids_, "", "")),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefix.model"));
  EXPECT_THAT(CreateWith(Prefix(ids_, std::string(129, 's'))),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefix.salt"));
  std::vector<int32_t> bad = ids_;
  bad[7] = -3;
  EXPECT_THAT(CreateWith(Prefix(bad)),
              StatusIs(absl::StatusCode::kInvalidArgument, "prefix.token_ids[7]"));
  CompressionSpec residual;
  residual.storage = StorageFormat::kInt4G32;
  residual.storage_set = true;
  residual.residual_tokens = 32;
  EXPECT_THAT(CreateWith(Prefix(ids_), residual),
              StatusIs(absl::StatusCode::kFailedPrecondition, "residual"));
  EXPECT_THAT(
      store().prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), "s-nope", Prefix(ids_)}),
      StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PrefixCacheTest, AnEvictedPrefixPublishesOnlyItsCleanBlocks) {
  auto b = CreateWith(Prefix(TokenIds(kTokens, 2)));
  KVC_ASSERT_OK(b);
  AppendLikeA(b->id, 0, kTokens);
  CompressParams p;
  p.sequence_id = b->id;
  p.spec = Streaming(4, 60);  // drops tokens 4..39: block 0 keeps 0-3 then 40..
  KVC_ASSERT_OK(store().Compress(p));
  auto published = store().prefixes().PublishPrefix(
      PublishPrefixParams{TenantScope(), b->id, Prefix(TokenIds(kTokens, 2))});
  KVC_ASSERT_OK(published);
  EXPECT_EQ(published->published_tokens, 0);
}

// Random creates (with and without the prefix), appends, compressions, publishes and
// releases: afterwards every block goes back to the pool once the cache is emptied.
TEST(PrefixCacheModelTest, HoldersReturnToZeroAfterRandomSharing) {
  const Geometry g;
  Fixture f(g);
  KvStore& store = *f.store;
  std::mt19937 rng(42);
  struct Live {
    std::string id;
    int64_t tokens;
    size_t doc;
  };
  std::vector<Live> live;
  const std::vector<std::vector<int32_t>> docs = {TokenIds(80, 1), TokenIds(80, 2)};
  for (int step = 0; step < 120; ++step) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0 || live.empty()) {
      CreateSequenceParams p;
      const size_t doc = rng() % 2;
      p.prefix = Prefix(docs[doc]);
      auto s = store.CreateSequence(p);
      KVC_ASSERT_OK(s);
      live.push_back(Live{s->id, s->visible_tokens, doc});
      continue;
    }
    Live& l = live[rng() % live.size()];
    const std::string id = l.id;
    int64_t& tokens = l.tokens;
    if (op == 1 && tokens < 80) {
      f.id = id;
      KVC_ASSERT_OK(f.AppendAll(tokens, 16));
      tokens += 16;
    } else if (op == 2) {
      KVC_ASSERT_OK(store.prefixes().PublishPrefix(
          PublishPrefixParams{TenantScope(), id, Prefix(docs[l.doc])}));
    } else if (op == 3) {
      CompressParams p;
      p.sequence_id = id;
      p.spec = Streaming(2, 20 + static_cast<int>(rng() % 40));
      KVC_ASSERT_OK(store.Compress(p));
    } else {
      KVC_ASSERT_OK(store.Release(id));
      live.erase(std::find_if(live.begin(), live.end(), [&](const Live& e) { return e.id == id; }));
    }
  }
  for (const Live& l : live) KVC_ASSERT_OK(store.Release(l.id));
  BlockPool* pool = *store.leases().FindPool("");
  const PrefixStats st = *store.stats().PrefixCacheStats("");
  EXPECT_GT(st.hits, 0);
  EXPECT_EQ(st.unreferenced_bytes, st.cached_bytes) << "no sequence holds anything";
  EXPECT_EQ(pool->used_bytes(), st.cached_bytes) << "only the cache holds blocks";
  // An allocation larger than the pool first empties the cache: every block comes back.
  std::vector<BlockId> out;
  EXPECT_THAT(pool->AllocateOrReclaim(StorageFormat::kF32, int64_t{1} << 30, "", &out),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(pool->used_bytes(), 0);
  EXPECT_EQ(pool->shares().frozen_blocks(), 0);
  EXPECT_EQ(store.stats().PrefixCacheStats("")->entries, 0);
}

// Four threads attach, append, compress, publish and release on one pool at once (TSan runs
// this): every sharer still reads the published bytes, and afterwards every block goes back.
TEST(PrefixCacheThreadTest, ConcurrentSharersSeeThePublishedBytesAndLeakNothing) {
  const Geometry g;
  Fixture f(g);
  KvStore& store = *f.store;
  const std::vector<int32_t> doc = TokenIds(64, 3);
  KVC_ASSERT_OK(f.AppendAll(0, 64));
  KVC_ASSERT_OK(
      store.prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), f.id, Prefix(doc)}));
  const Dump want = Read(store, f.id, 64);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0}, failed{0};
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < 25; ++i) {
        CreateSequenceParams p;
        p.prefix = Prefix(doc);
        auto s = store.CreateSequence(p);
        if (!s.ok() || s->attached_tokens != 64) {
          ++failed;
          continue;
        }
        if (!(Read(store, s->id, 64) == want)) ++wrong;
        CompressParams c;
        c.sequence_id = s->id;
        c.spec = Streaming(2, 8 + static_cast<int>(rng() % 40));
        if (!store.Compress(c).ok()) ++failed;
        if (!store.Release(s->id).ok()) ++failed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(Read(store, f.id, 64), want) << "the publisher's bytes never changed";
  KVC_ASSERT_OK(store.Release(f.id));
  BlockPool* pool = *store.leases().FindPool("");
  std::vector<BlockId> out;
  EXPECT_THAT(pool->AllocateOrReclaim(StorageFormat::kF32, int64_t{1} << 30, "", &out),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(pool->used_bytes(), 0);
}

}  // namespace
}  // namespace kvc::cachesvc
