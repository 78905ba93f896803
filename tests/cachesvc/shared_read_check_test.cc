// Reads of shared (prefix-cache) blocks re-verify their checksums on a sampled fraction of
// Fetch, Attend and Compress calls (KvStoreOptions::verify_shared_reads_every): a block whose bytes
// changed after it was published is never served once found, to any sequence that shares it;
// it leaves the cache, the refusal is counted, and the block's mark goes with its last holder.
#include <random>

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

class SharedReadCheckTest : public ::testing::Test {
 protected:
  // A (100 tokens, published) and B (attached to A's 96) in a store verifying 1 read in
  // `every`.
  void Start(int64_t every) {
    KvStoreOptions o = Options(geom_);
    o.verify_shared_reads_every = every;
    auto store = KvStore::Create(o);
    KVC_ASSERT_OK(store);
    a_.store = std::move(*store);
    auto a = a_.store->CreateSequence({});
    KVC_ASSERT_OK(a);
    a_.id = a->id;
    KVC_ASSERT_OK(a_.AppendAll(0, kTokens));
    std::mt19937 rng(7);
    for (int i = 0; i < kTokens; ++i) ids_.push_back(static_cast<int32_t>(rng() % 49152));
    KVC_ASSERT_OK(
        store_().prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a_.id, Prefix()}));
    CreateSequenceParams p;
    p.prefix = Prefix();
    auto b = store_().CreateSequence(p);
    KVC_ASSERT_OK(b);
    ASSERT_EQ(b->attached_tokens, 96);
    b_ = b->id;
  }
  KvStore& store_() { return *a_.store; }
  PrefixSpec Prefix() const { return PrefixSpec{"smollm2-135m", "", ids_}; }

  // Flips one byte of the first block A wrote (layer 0, kv head 0, tokens 0-15), shared by
  // B and the cache, through the pool's backend as a memory fault would.
  void FlipSharedByte() {
    BlockPool* pool = *store_().leases().FindPool("");
    const kernels::PagedArena arena = pool->arena(StorageFormat::kF32);
    ASSERT_TRUE(pool->backend()
                    ->Memset(static_cast<char*>(arena.base) + 100, 0x5a, 1, kernels::StreamHandle{})
                    .ok());
    ASSERT_TRUE(pool->backend()->Synchronize(kernels::StreamHandle{}).ok());
  }

  absl::Status FetchStatus(const std::string& id, std::vector<int64_t> layers = {}) {
    FetchParams f;
    f.sequence_id = id;
    f.layers = std::move(layers);
    int chunks = 0;
    absl::Status s = store_().Fetch(f, [&](FetchChunk&) {
      ++chunks;
      return true;
    });
    if (!s.ok()) {
      EXPECT_EQ(chunks, 0) << "a refused Fetch sends nothing";
    }
    return s;
  }

  absl::Status AttendStatus(const std::string& id, int layer) {
    const std::vector<float> q = Gaussian(static_cast<size_t>(geom_.qheads * geom_.dim), 3);
    AttendParams a;
    a.sequence_id = id;
    a.layer = layer;
    a.dtype = DType::kF32;
    a.queries = Bytes(q);
    a.positions = {kTokens};
    return store_().Attend(a).status();
  }

  Geometry geom_;
  Fixture a_{geom_};  // its store is replaced by Start's
  std::string b_;
  std::vector<int32_t> ids_;
};

TEST_F(SharedReadCheckTest, CorruptSharedBlockIsNeverServedOnceFound) {
  Start(/*every=*/1);
  KVC_EXPECT_OK(FetchStatus(b_));
  FlipSharedByte();
  EXPECT_THAT(FetchStatus(b_),
              StatusIs(absl::StatusCode::kDataLoss, "no longer match the checksum"));
  // A wrote the block and published it: it shares the fault and is refused too, as is
  // decode attention over the layer. Layer 1 does not read the block.
  EXPECT_THAT(FetchStatus(a_.id), StatusIs(absl::StatusCode::kDataLoss, "layer 0"));
  EXPECT_THAT(AttendStatus(b_, 0), StatusIs(absl::StatusCode::kDataLoss));
  KVC_EXPECT_OK(FetchStatus(b_, {1}));
  KVC_EXPECT_OK(AttendStatus(b_, 1));
  // Compress would copy the corrupt bytes into blocks of B's own, beyond any later check.
  CompressParams cp;
  cp.sequence_id = b_;
  cp.spec.storage = StorageFormat::kInt8;
  cp.spec.storage_set = true;
  EXPECT_THAT(store_().Compress(cp).status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(store_().GetSequence(b_)->storage, StorageFormat::kF32) << "nothing changed";
  const PrefixStats s = *store_().stats().PrefixCacheStats("");
  EXPECT_EQ(s.corrupt_reads, 4);
  EXPECT_EQ(s.checksum_misses, 1) << "the entry holding the block";
  EXPECT_EQ(s.entries, 5);
  LookupPrefixParams p;
  p.prefix = Prefix();
  EXPECT_EQ(store_().prefixes().LookupPrefix(p)->cached_tokens, 0)
      << "the prefix is a miss from block 0";

  // Once every holder let go, the block goes back to the pool unmarked: a new sequence that
  // reuses it reads its own bytes.
  KVC_ASSERT_OK(store_().Release(a_.id, TenantScope()));
  KVC_ASSERT_OK(store_().Release(b_, TenantScope()));
  BlockPool* pool = *store_().leases().FindPool("");
  EXPECT_EQ(pool->shares().corrupt_blocks(), 0);
  auto c = store_().CreateSequence({});
  KVC_ASSERT_OK(c);
  a_.id = c->id;
  KVC_ASSERT_OK(a_.AppendAll(0, kTokens));
  KVC_EXPECT_OK(FetchStatus(c->id));
}

TEST_F(SharedReadCheckTest, OneReadInNIsVerified) {
  Start(/*every=*/3);
  KVC_EXPECT_OK(FetchStatus(b_));  // read 0: verified, clean
  FlipSharedByte();
  // Reads 1 and 2 are not sampled: the fault is not seen yet. This is the price of
  // sampling; every = 1 closes it.
  const Dump served = Read(store_(), b_);
  KVC_EXPECT_OK(FetchStatus(b_));
  EXPECT_THAT(FetchStatus(b_), StatusIs(absl::StatusCode::kDataLoss));  // read 3: verified
  EXPECT_THAT(FetchStatus(b_), StatusIs(absl::StatusCode::kDataLoss))
      << "read 4 is not sampled, but the block is known corrupt";
  EXPECT_FALSE(served.chunks.empty());
  EXPECT_EQ(store_().stats().PrefixCacheStats("")->corrupt_reads, 2);
}

TEST_F(SharedReadCheckTest, UnsharedBlocksAreNotChecked) {
  Start(/*every=*/1);
  // B's own blocks (tokens from 96) carry no checksum: appending and reading them costs no
  // verification and is never refused.
  const std::string saved = a_.id;
  a_.id = b_;
  KVC_ASSERT_OK(a_.AppendAll(96, 20));
  a_.id = saved;
  KVC_EXPECT_OK(FetchStatus(b_));
  EXPECT_EQ(store_().stats().PrefixCacheStats("")->corrupt_reads, 0);
}

TEST(SharedReadCheckOptionsTest, EveryMustBePositive) {
  KvStoreOptions o = Options(Geometry{});
  o.verify_shared_reads_every = 0;
  EXPECT_THAT(KvStore::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "verify_shared_reads_every"));
}

}  // namespace
}  // namespace kvc::cachesvc
