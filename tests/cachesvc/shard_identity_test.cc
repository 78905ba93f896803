// Cluster ids: the grammar shared by kvcached and the cluster client, and a KvStore that is a
// shard — every id it hands out names it and its incarnation, bare ids still work, and an id
// of another shard or of an earlier incarnation is NOT_FOUND saying which.
#include "cachesvc/core/base/shard_identity.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/store/kv_store.h"
#include "common/cluster_id.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

TEST(ClusterIdTest, ShardNamesAreDnsLabels) {
  for (const std::string& good : {std::string("a"), std::string("kvcached-0"), std::string("0"),
                                  std::string("shard-12-b"), std::string(63, 'x')}) {
    EXPECT_TRUE(IsValidShardName(good)) << good;
  }
  for (const std::string& bad :
       {std::string(), std::string(64, 'x'), std::string("-a"), std::string("a-"), std::string("A"),
        std::string("a_b"), std::string("a.b"), std::string("a:b")}) {
    EXPECT_FALSE(IsValidShardName(bad)) << bad;
  }
}

TEST(ClusterIdTest, ParsesShardIncarnationAndLocalId) {
  ClusterIdParts parts;
  ASSERT_TRUE(ParseClusterId("kvcached-1:0a1b2c3d:s-00ff", &parts));
  EXPECT_EQ(parts.shard, "kvcached-1");
  EXPECT_EQ(parts.incarnation, "0a1b2c3d");
  EXPECT_EQ(parts.local, "s-00ff");
  // The local id may hold colons itself (client ids allow them).
  ASSERT_TRUE(ParseClusterId("a:00000001:x:y", &parts));
  EXPECT_EQ(parts.local, "x:y");
  for (const char* not_cluster :
       {"s-0123456789abcdef", "doc", "a:0a1b2c3d:", "a:0A1B2C3D:x", "a:0a1b2c3:x", "A:0a1b2c3d:x",
        ":0a1b2c3d:x", "a:0a1b2c3dx", "a:0a1b2c3d"}) {
    EXPECT_FALSE(ParseClusterId(not_cluster, nullptr)) << not_cluster;
  }
}

TEST(ShardIdentityTest, RefusesBadNamesAndWeights) {
  EXPECT_THAT(ShardIdentity::Create("Kvcached_0", 1).status(),
              StatusIs(Code::kInvalidArgument, "DNS label"));
  EXPECT_THAT(ShardIdentity::Create("a", -1).status(),
              StatusIs(Code::kInvalidArgument, "(0, 1000]"));
  EXPECT_THAT(ShardIdentity::Create("a", 1001).status(), StatusIs(Code::kInvalidArgument));
  KVC_ASSERT_OK_AND_ASSIGN(const ShardIdentity zero, ShardIdentity::Create("a", 0));
  EXPECT_EQ(zero.weight(), 1.0);
}

TEST(ShardIdentityTest, IncarnationsDifferPerStart) {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    const ShardIdentity id;
    EXPECT_EQ(id.incarnation().size(), 8u);
    EXPECT_NE(id.incarnation(), "00000000");
    seen.insert(id.incarnation());
  }
  EXPECT_GE(seen.size(), 63u);  // 32 random bits each: a repeat among 64 is ~5e-7 likely
}

TEST(ShardIdentityTest, WithoutANameIdsStayLocal) {
  const ShardIdentity single;
  EXPECT_EQ(single.Qualify("doc"), "doc");
  KVC_ASSERT_OK_AND_ASSIGN(const std::string key, single.Resolve("b:0a1b2c3d:doc"));
  EXPECT_EQ(key, "b:0a1b2c3d:doc");  // a single server has no cluster ids to interpret
  EXPECT_TRUE(single.CheckClientId("b:0a1b2c3d:doc").ok());
}

KvStoreOptions ShardStore(const std::string& name) {
  PoolOptions pool;
  pool.device = testing::TestPoolDevice();
  pool.name = "p";
  pool.geometry.num_layers = 2;
  pool.geometry.num_kv_heads = 2;
  pool.geometry.num_query_heads = 4;
  pool.geometry.head_dim = 32;
  pool.geometry.block_tokens = 16;
  pool.capacity_bytes = int64_t{4} << 20;
  KvStoreOptions options;
  options.pools.push_back(pool);
  options.shard_name = name;
  return options;
}

TEST(ShardStoreTest, IdsNameTheShardAndIncarnationAndBareIdsStillWork) {
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(ShardStore("kvcached-0")));
  const std::string prefix = absl::StrCat("kvcached-0:", store->stats().shard().incarnation(), ":");

  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot minted, store->CreateSequence({}));
  EXPECT_TRUE(absl::StartsWith(minted.id, prefix)) << minted.id;
  ClusterIdParts parts;
  ASSERT_TRUE(ParseClusterId(minted.id, &parts));
  EXPECT_TRUE(absl::StartsWith(parts.local, "s-"));

  CreateSequenceParams chosen;
  chosen.client_sequence_id = "doc:7";
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot named, store->CreateSequence(chosen));
  EXPECT_EQ(named.id, prefix + "doc:7");
  // The caller's own id, bare or qualified, names the same sequence.
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot by_bare, store->GetSequence("doc:7"));
  EXPECT_EQ(by_bare.id, named.id);
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot by_full, store->GetSequence(named.id));
  EXPECT_EQ(by_full.id, named.id);
  EXPECT_THAT(store->CreateSequence(chosen).status(), StatusIs(Code::kAlreadyExists));

  // Release by the bare id frees the registry entry of the qualified one.
  KVC_ASSERT_OK(store->Release("doc:7").status());
  EXPECT_THAT(store->GetSequence(named.id).status(), StatusIs(Code::kNotFound));
  KVC_ASSERT_OK(store->CreateSequence(chosen).status());  // the id is free again
}

TEST(ShardStoreTest, IdsOfAnotherShardOrAnEarlierIncarnationAreNotFoundSayingWhy) {
  KVC_ASSERT_OK_AND_ASSIGN(auto store, KvStore::Create(ShardStore("kvcached-0")));
  KVC_ASSERT_OK_AND_ASSIGN(const SequenceSnapshot live, store->CreateSequence({}));
  ClusterIdParts parts;
  ASSERT_TRUE(ParseClusterId(live.id, &parts));
  const std::string other_incarnation = parts.incarnation == "00000001" ? "00000002" : "00000001";

  EXPECT_THAT(
      store->GetSequence(absl::StrCat("kvcached-0:", other_incarnation, ":", parts.local)).status(),
      StatusIs(Code::kNotFound, "restarted"));
  EXPECT_THAT(
      store->Release(absl::StrCat("kvcached-1:", parts.incarnation, ":", parts.local)).status(),
      StatusIs(Code::kNotFound, "belongs to shard 'kvcached-1'"));
  // Neither touched the live sequence.
  KVC_EXPECT_OK(store->GetSequence(live.id).status());

  // A client id that reads as a cluster id would be ambiguous on a shard.
  CreateSequenceParams ambiguous;
  ambiguous.client_sequence_id = absl::StrCat("kvcached-1:", parts.incarnation, ":x");
  EXPECT_THAT(store->CreateSequence(ambiguous).status(),
              StatusIs(Code::kInvalidArgument, "cluster id"));
}

TEST(ShardStoreTest, ABadShardNameFailsStoreCreation) {
  EXPECT_THAT(KvStore::Create(ShardStore("Shard_0")).status(),
              StatusIs(Code::kInvalidArgument, "shard name"));
}

}  // namespace
}  // namespace kvc::cachesvc
