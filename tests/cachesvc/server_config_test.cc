#include "cachesvc/rpc/server_config.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::StatusIs;

TEST(ServerConfigTest, DefaultIsTheReferenceModelPool) {
  const ServerOptions o = DefaultServerOptions();
  EXPECT_EQ(o.listen, "127.0.0.1:50051");
  ASSERT_EQ(o.store.pools.size(), 1u);
  const PoolGeometry& g = o.store.pools[0].geometry;
  EXPECT_EQ(g.num_layers, 30);
  EXPECT_EQ(g.num_kv_heads, 3);
  EXPECT_EQ(g.num_query_heads, 9);
  EXPECT_EQ(g.head_dim, 64);
}

TEST(ServerConfigTest, ParsesPoolsAndFillsDefaults) {
  KVC_ASSERT_OK_AND_ASSIGN(ServerOptions o, ParseServerConfig(R"(
    listen: "0.0.0.0:6000"
    pools { name: "a" capacity_bytes: 1048576
            geometry { num_layers: 2 num_kv_heads: 1 head_dim: 64 dtype: DTYPE_BF16 } }
    pools { name: "b" capacity_bytes: 2097152
            geometry { num_layers: 32 num_kv_heads: 8 num_query_heads: 32 head_dim: 128
                       rope { theta: 500000 } } }
  )"));
  EXPECT_EQ(o.listen, "0.0.0.0:6000");
  ASSERT_EQ(o.store.pools.size(), 2u);
  EXPECT_EQ(o.store.pools[0].geometry.block_tokens, 16);
  EXPECT_EQ(o.store.pools[0].geometry.num_query_heads, 1);
  EXPECT_EQ(o.store.pools[0].geometry.dtype, DType::kBF16);
  EXPECT_TRUE(o.store.pools[1].geometry.rope.enabled);
  EXPECT_EQ(o.store.pools[1].geometry.rope.theta, 500000);
}

TEST(ServerConfigTest, SyntaxErrorsNameTheLine) {
  EXPECT_THAT(ParseServerConfig("pools { name: \"a\"\n capacity: 3 }"),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 2"));
  EXPECT_THAT(ParseServerConfig("listen: \"x:1\""),
              StatusIs(absl::StatusCode::kInvalidArgument, "no pools"));
  EXPECT_THAT(LoadServerConfig("/nonexistent/kvcached.textproto"),
              StatusIs(absl::StatusCode::kNotFound, "cannot read"));
}

TEST(ServerConfigTest, ParsesByteSizes) {
  EXPECT_EQ(*ParseByteSize("1024"), 1024);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512LL << 20);
  EXPECT_EQ(*ParseByteSize("2GiB"), 2LL << 30);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseByteSize("3GB"), 3000000000LL);
  EXPECT_THAT(ParseByteSize("lots"), StatusIs(absl::StatusCode::kInvalidArgument, "byte size"));
  EXPECT_THAT(ParseByteSize("-1GiB"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseByteSize("GiB"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvc::cachesvc

namespace kvc::cachesvc {
namespace {

// The sample shipped in deploy/ must stay loadable and valid.
TEST(ServerConfigTest, ShippedSampleConfigLoads) {
  KVC_ASSERT_OK_AND_ASSIGN(ServerOptions o,
                           LoadServerConfig(KVC_SOURCE_DIR "/deploy/kvcached.textproto"));
  ASSERT_EQ(o.store.pools.size(), 2u);
  EXPECT_EQ(o.store.pools[1].geometry.dtype, DType::kBF16);
  KVC_EXPECT_OK(KvStore::Create(o.store).status());
}

}  // namespace
}  // namespace kvc::cachesvc
