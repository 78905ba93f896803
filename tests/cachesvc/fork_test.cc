// ForkSequence through the store: the fork serves the source's bytes, positions and scores
// while sharing its whole blocks (pool bytes grow by the copied last blocks only); every
// mutation of either side copies before it writes, so the other's Fetch stays
// byte-identical; refused forks (quota, full pool, bad id, released source) change nothing;
// holders return to zero and the pool to empty whatever order the sharers go in.
#include <algorithm>
#include <functional>
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

constexpr int kTokens = 100;      // 6 whole blocks of 16 + 4 per lane
constexpr int64_t kBlock = 8192;  // f32 block: 16 tokens x 64 x 4 bytes x (K + V)
constexpr int64_t kLanes = 4;     // 2 layers x 2 kv heads

CompressionSpec H2o(int heavy, int recent) {
  CompressionSpec s;
  s.eviction = Eviction::kH2o;
  s.heavy = heavy;
  s.recent = recent;
  return s;
}

class ForkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_.emplace(Geometry{}, CompressionSpec{});
    KVC_ASSERT_OK(a_->AppendAll(0, kTokens));
  }
  KvStore& store() { return *a_->store; }
  int64_t Used() { return store().stats().ListPools()[0].used_bytes; }
  absl::StatusOr<SequenceSnapshot> Fork(const std::string& id, const std::string& name = "") {
    return store().ForkSequence(ForkSequenceParams{TenantScope(), id, name});
  }
  // Appends tokens [from, from + n) of A's data to `id`.
  absl::Status AppendLikeA(const std::string& id, int64_t from, int64_t n) {
    const std::string saved = a_->id;
    a_->id = id;
    absl::Status s = a_->AppendAll(from, n);
    a_->id = saved;
    return s;
  }
  absl::Status AttendOn(const std::string& id, int32_t position, uint32_t seed) {
    AttendParams at;
    at.sequence_id = id;
    at.dtype = DType::kF32;
    const std::vector<float> q = Gaussian(4 * 64, seed);
    at.queries = Bytes(q);
    at.positions = {position};
    return store().Attend(at).status();
  }

  std::optional<Fixture> a_;
};

TEST_F(ForkTest, ForkSharesWholeBlocksAndServesTheSameBytes) {
  const int64_t used = Used();
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, Fork(a_->id, "b-fork"));
  EXPECT_EQ(b.id, "b-fork");
  EXPECT_EQ(b.visible_tokens, kTokens);
  EXPECT_EQ(b.stored_token_heads, kTokens * kLanes);
  EXPECT_EQ(b.bytes, store().GetSequence(a_->id)->bytes) << "a fork holds what the source holds";
  EXPECT_EQ(Used(), used + kLanes * kBlock) << "only each lane's partly filled block is copied";
  EXPECT_EQ(Read(store(), b.id), Read(store(), a_->id));
  // Both append past the fork, each into its own copy of the last block.
  KVC_ASSERT_OK(AppendLikeA(b.id, kTokens, 20));
  KVC_ASSERT_OK(a_->AppendAll(kTokens, 7));
  EXPECT_EQ(Read(store(), b.id, kTokens), Read(store(), a_->id, kTokens));
  EXPECT_NE(Read(store(), b.id), Read(store(), a_->id));
  EXPECT_EQ(store().GetSequence(b.id)->visible_tokens, kTokens + 20);
  EXPECT_EQ(store().GetSequence(a_->id)->visible_tokens, kTokens + 7);
}

// Blocks a fork froze are immutable like published ones, so either side may publish them
// afterwards; a later sequence attaches them and reads the same bytes.
TEST_F(ForkTest, ForkedBlocksCanBePublishedAndAttached) {
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, Fork(a_->id));
  std::vector<int32_t> ids(kTokens);
  for (int i = 0; i < kTokens; ++i) ids[static_cast<size_t>(i)] = 1000 + i;
  const PrefixSpec prefix{"smollm2-135m", "", ids};
  KVC_ASSERT_OK_AND_ASSIGN(
      const PublishPrefixResult published,
      store().prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), b.id, prefix}));
  EXPECT_EQ(published.published_tokens, 96);
  EXPECT_EQ(published.new_tokens, 96);
  const int64_t used = Used();
  CreateSequenceParams p;
  p.prefix = prefix;
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot c, store().CreateSequence(p));
  EXPECT_EQ(c.attached_tokens, 96);
  EXPECT_EQ(Used(), used) << "attaching copies nothing";
  EXPECT_EQ(Read(store(), c.id), Read(store(), a_->id, 96));
  // The source publishing the same blocks adds nothing: they are cached already.
  KVC_ASSERT_OK_AND_ASSIGN(
      const PublishPrefixResult again,
      store().prefixes().PublishPrefix(PublishPrefixParams{TenantScope(), a_->id, prefix}));
  EXPECT_EQ(again.new_tokens, 0);
  for (const std::string& id : {a_->id, b.id, c.id})
    KVC_ASSERT_OK(store().Release(id, TenantScope()));
  EXPECT_EQ(Used(), 6 * kLanes * kBlock) << "only the cache's 6 entries stay";
}

TEST_F(ForkTest, EveryMutationOfEitherSideCopiesOnWrite) {
  struct Case {
    const char* name;
    std::function<absl::Status(const std::string&)> mutate;
  };
  const std::vector<Case> cases = {
      {"streaming (evicts, compacts, re-rotates)",
       [&](const std::string& id) { return Mutate(store(), id, Streaming(4, 20)); }},
      {"streaming 4+60 (holes inside shared blocks)",
       [&](const std::string& id) { return Mutate(store(), id, Streaming(4, 60)); }},
      {"int4 conversion", [&](const std::string& id) { return Mutate(store(), id, Int4()); }},
      {"h2o after attend",
       [&](const std::string& id) {
         KVC_RETURN_IF_ERROR(AttendOn(id, 130, 9));
         return Mutate(store(), id, H2o(24, 8));
       }},
      {"append", [&](const std::string& id) { return AppendLikeA(id, kTokens, 30); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, Fork(a_->id));
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot d, Fork(b.id));  // a fork of a fork
    const Dump a_before = Read(store(), a_->id);
    const Dump d_before = Read(store(), d.id);
    KVC_ASSERT_OK(c.mutate(b.id));
    EXPECT_EQ(Read(store(), a_->id), a_before) << "the source changed";
    EXPECT_EQ(Read(store(), d.id), d_before) << "another fork changed";
    // And the other way round: the source mutates, the forks stay.
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot e, Fork(a_->id));
    const Dump e_before = Read(store(), e.id);
    const Dump b_now = Read(store(), b.id);
    KVC_ASSERT_OK(Mutate(store(), a_->id, Streaming(2, 40)));
    EXPECT_EQ(Read(store(), e.id), e_before) << "a fork saw its source's eviction";
    EXPECT_EQ(Read(store(), b.id), b_now);
    // Put A back for the next case: a fresh A with the same data.
    for (const std::string& id : {b.id, d.id, e.id}) KVC_ASSERT_OK(store().Release(id));
    KVC_ASSERT_OK(store().Release(a_->id));
    EXPECT_EQ(Used(), 0) << "every block went back";
    KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot fresh, store().CreateSequence({}));
    a_->id = fresh.id;
    KVC_ASSERT_OK(a_->AppendAll(0, kTokens));
  }
}

TEST_F(ForkTest, AForkOfACompressedSequenceKeepsItsTiersPositionsAndScores) {
  // A: INT4 storage with a raw residual window of 24, attention scores from decode steps.
  CompressionSpec spec = Int4();
  spec.residual_tokens = 24;
  KVC_ASSERT_OK(Mutate(store(), a_->id, spec));
  KVC_ASSERT_OK(AttendOn(a_->id, 100, 3));
  KVC_ASSERT_OK(AttendOn(a_->id, 100, 4));
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot b, Fork(a_->id));
  EXPECT_EQ(Read(store(), b.id), Read(store(), a_->id));
  EXPECT_EQ(b.storage, StorageFormat::kInt4G32);
  EXPECT_EQ(b.bytes, store().GetSequence(a_->id)->bytes);
  // The scores came along: the same H2O eviction keeps the same tokens on both.
  KVC_ASSERT_OK(Mutate(store(), a_->id, H2o(20, 24)));
  KVC_ASSERT_OK(Mutate(store(), b.id, H2o(20, 24)));
  EXPECT_EQ(Read(store(), b.id), Read(store(), a_->id));
  // Appends age tokens out of the residual window on one side only.
  const Dump a_before = Read(store(), a_->id);
  KVC_ASSERT_OK(AppendLikeA(b.id, kTokens, 40));
  EXPECT_EQ(Read(store(), a_->id), a_before);
}

TEST_F(ForkTest, RefusedForksChangeNothing) {
  const int64_t used = Used();
  const int64_t sequences = store().stats().ListPools()[0].sequences;
  EXPECT_THAT(Fork("s-0000000000000000"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Fork(""), StatusIs(absl::StatusCode::kInvalidArgument, "sequence_id"));
  EXPECT_THAT(Fork(a_->id, "bad name!"),
              StatusIs(absl::StatusCode::kInvalidArgument, "client_sequence_id"));
  KVC_ASSERT_OK(Fork(a_->id, "taken"));
  const int64_t used_one = Used();
  EXPECT_THAT(Fork(a_->id, "taken"), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(Used(), used_one) << "the refused fork's copied blocks went back";
  KVC_ASSERT_OK(store().Release("taken"));
  EXPECT_EQ(Used(), used);
  store().SetDraining(true);
  EXPECT_THAT(Fork(a_->id), StatusIs(absl::StatusCode::kUnavailable, "draining"));
  store().SetDraining(false);
  KVC_ASSERT_OK(store().Release(a_->id));
  EXPECT_THAT(Fork(a_->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(store().stats().ListPools()[0].sequences, sequences - 1);
  EXPECT_EQ(Used(), 0);
}

TEST(ForkCapacityTest, AFullPoolRefusesTheForkAndChangesNothing) {
  // 30 blocks: A takes 28 (7 per lane); a fork needs 4 more for its last blocks.
  Fixture a(Geometry{}, CompressionSpec{}, 30 * kBlock);
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  const int64_t used = a.store->stats().ListPools()[0].used_bytes;
  const Dump before = Read(*a.store, a.id);
  EXPECT_THAT(a.store->ForkSequence(ForkSequenceParams{TenantScope(), a.id, ""}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(a.store->stats().ListPools()[0].used_bytes, used);
  EXPECT_EQ(a.store->stats().ListPools()[0].sequences, 1);
  EXPECT_EQ(a.store->stats().GetPoolStats("")->prefix_cache.entries, 0);
  // Nothing was frozen by the refused fork: A still compacts in place.
  KVC_ASSERT_OK(Mutate(*a.store, a.id, Streaming(4, 20)));
  EXPECT_LT(a.store->stats().ListPools()[0].used_bytes, used);
  EXPECT_NE(Read(*a.store, a.id), before);
}

TEST(ForkQuotaTest, AForkIsChargedToTheTenantAndRefusedOverQuota) {
  const Geometry g;
  KvStoreOptions o = Options(g);
  // A holds 7 blocks x 4 lanes = 229376 bytes; a fork of it the same.
  o.quotas.push_back(TenantQuota{"small", 300000, 0});
  auto created = KvStore::Create(o);
  KVC_ASSERT_OK(created);
  Fixture a(g);
  a.store = std::move(*created);
  CreateSequenceParams p;
  p.tenant = "small";
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot s, a.store->CreateSequence(p));
  a.id = s.id;
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  const int64_t used = a.store->stats().ListPools()[0].used_bytes;
  EXPECT_EQ(a.store->stats().TenantPoolStats("small", "")->used_bytes, 7 * kLanes * kBlock);
  EXPECT_THAT(a.store->ForkSequence(ForkSequenceParams{TenantScope(), a.id, ""}),
              StatusIs(absl::StatusCode::kResourceExhausted, "quota"));
  EXPECT_EQ(a.store->stats().ListPools()[0].used_bytes, used);
  EXPECT_EQ(a.store->stats().TenantPoolStats("small", "")->used_bytes, 7 * kLanes * kBlock);
  EXPECT_EQ(a.store->stats().TenantPoolStats("small", "")->sequences, 1);
}

// Random forks, mutations and releases: whatever the order, the survivors serve what they
// served and, once all are gone, no block is held and none is still frozen.
TEST(ForkModelTest, HoldersReturnToZeroAfterRandomForks) {
  Fixture a(Geometry{}, CompressionSpec{}, int64_t{256} << 20);
  KVC_ASSERT_OK(a.AppendAll(0, kTokens));
  std::mt19937 rng(5);
  std::vector<std::pair<std::string, Dump>> live = {{a.id, Read(*a.store, a.id)}};
  for (int step = 0; step < 120; ++step) {
    const size_t i = rng() % live.size();
    const std::string id = live[i].first;
    switch (rng() % 5) {
      case 0:
      case 1: {
        KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot f,
                                 a.store->ForkSequence(ForkSequenceParams{TenantScope(), id, ""}));
        live.emplace_back(f.id, Read(*a.store, f.id));
        EXPECT_EQ(live.back().second, live[i].second);
        break;
      }
      case 2:
        KVC_ASSERT_OK(
            Mutate(*a.store, id,
                   Streaming(2 + static_cast<int>(rng() % 4), 10 + static_cast<int>(rng() % 40))));
        live[i].second = Read(*a.store, id);
        break;
      case 3: {
        const std::string saved = a.id;
        a.id = id;
        const int64_t at = a.store->GetSequence(id)->visible_tokens;
        KVC_ASSERT_OK(a.AppendAll(at, 1 + static_cast<int64_t>(rng() % 20)));
        a.id = saved;
        live[i].second = Read(*a.store, id);
        break;
      }
      default:
        if (live.size() > 1) {
          KVC_ASSERT_OK(a.store->Release(id));
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
    }
    for (const auto& [other, dump] : live) {
      ASSERT_EQ(Read(*a.store, other), dump) << "step " << step << ": " << other << " changed";
    }
  }
  for (const auto& [id, dump] : live) KVC_ASSERT_OK(a.store->Release(id));
  EXPECT_EQ(a.store->stats().ListPools()[0].used_bytes, 0);
  KVC_ASSERT_OK_AND_ASSIGN(BlockPool * pool, a.store->leases().FindPool(""));
  EXPECT_EQ(pool->shares().frozen_blocks(), 0);
}

}  // namespace
}  // namespace kvc::cachesvc
