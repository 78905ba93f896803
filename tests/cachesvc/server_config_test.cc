#include "cachesvc/server/server_config.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/pool_options.h"
#include "gtest/gtest.h"
#include "kvc/kernels/backend.h"
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
    transfer_listen: "0.0.0.0:6001"
    transfer_advertise_host: "10.0.0.7"
    transfer_nccl_library: "libnccl.so.2"
    pools { name: "a" capacity_bytes: 1048576
            geometry { num_layers: 2 num_kv_heads: 1 head_dim: 64 dtype: DTYPE_BF16 } }
    pools { name: "b" capacity_bytes: 2097152 keep_free_bytes: 0
            geometry { num_layers: 32 num_kv_heads: 8 num_query_heads: 32 head_dim: 128
                       rope { theta: 500000 } } }
  )"));
  EXPECT_EQ(o.listen, "0.0.0.0:6000");
  EXPECT_EQ(o.transfer_listen, "0.0.0.0:6001");
  EXPECT_EQ(o.transfer_advertise_host, "10.0.0.7");
  EXPECT_EQ(o.transfer_nccl_library, "libnccl.so.2");
  ASSERT_EQ(o.store.pools.size(), 2u);
  EXPECT_EQ(o.store.pools[0].geometry.block_tokens, 16);
  EXPECT_EQ(o.store.pools[0].geometry.num_query_heads, 1);
  EXPECT_EQ(o.store.pools[0].geometry.dtype, DType::kBF16);
  EXPECT_TRUE(o.store.pools[1].geometry.rope.enabled);
  EXPECT_EQ(o.store.pools[1].geometry.rope.theta, 500000);
  // keep_free_bytes: unset = a quarter of the capacity; 0 is a value (keep no free pages).
  EXPECT_FALSE(o.store.pools[0].keep_free_bytes.has_value());
  EXPECT_EQ(KeepFreeBytes(o.store.pools[0]), 1048576 / 4);
  EXPECT_EQ(o.store.pools[1].keep_free_bytes, 0);
  PoolOptions negative = o.store.pools[0];
  negative.keep_free_bytes = -1;
  EXPECT_THAT(ValidatePoolOptions(negative),
              StatusIs(absl::StatusCode::kInvalidArgument, "keep_free_bytes is -1"));
}

TEST(ServerConfigTest, ParsesLeaseLimits) {
  const std::string pool = R"(pools { name: "a" capacity_bytes: 1048576
                                geometry { num_layers: 2 num_kv_heads: 1 head_dim: 64 } })";
  KVC_ASSERT_OK_AND_ASSIGN(const ServerOptions defaults, ParseServerConfig(pool));
  EXPECT_EQ(defaults.store.leases.default_ttl_ms, 30000);
  EXPECT_EQ(defaults.store.leases.max_ttl_ms, 300000);
  EXPECT_EQ(defaults.store.leases.max_per_scope, 256);
  EXPECT_EQ(defaults.store.leases.max_lifetime_ms, 600000);
  KVC_ASSERT_OK_AND_ASSIGN(
      const ServerOptions o,
      ParseServerConfig(pool + R"( leases { default_ttl_ms: 5000 max_ttl_ms: 60000
                                            max_per_tenant: 8 max_lifetime_ms: 120000 })"));
  EXPECT_EQ(o.store.leases.default_ttl_ms, 5000);
  EXPECT_EQ(o.store.leases.max_ttl_ms, 60000);
  EXPECT_EQ(o.store.leases.max_per_scope, 8);
  EXPECT_EQ(o.store.leases.max_lifetime_ms, 120000);
  EXPECT_THAT(ParseServerConfig(pool + " leases { max_lifetime_ms: -1 }"),
              StatusIs(absl::StatusCode::kInvalidArgument, "leases.max_lifetime_ms is -1"));
  EXPECT_THAT(ParseServerConfig(pool + " leases { default_ttl_ms: 400000 }"),
              StatusIs(absl::StatusCode::kInvalidArgument, "above leases.max_ttl_ms"));
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

// Every config shipped under deploy/ parses, passes the exposure rule kvcached applies at
// startup (no plaintext or unauthenticated non-loopback listener without `insecure`), and
// builds its pools: config the server would refuse must not ship. (The TLS and tokens
// files they name are mounted at run time, so only their presence in the config is checked.)
// True when this build has the CUDA backend and the machine a device for it (a GPU, or the
// cudasim build's simulated one).
bool CudaDeviceUsable() {
  std::unique_ptr<kernels::KernelBackend> backend;
  return kernels::CreateBackend(kernels::BackendKind::kCuda, {}, &backend).ok();
}

TEST(ServerConfigTest, EveryShippedConfigWouldStart) {
  int checked = 0, refused = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(KVC_SOURCE_DIR "/deploy")) {
    if (entry.path().extension() != ".textproto") continue;
    SCOPED_TRACE(entry.path().string());
    ++checked;
    KVC_ASSERT_OK_AND_ASSIGN(ServerOptions o, LoadServerConfig(entry.path().string()));
    KVC_EXPECT_OK(CheckExposure(o));
    EXPECT_FALSE(o.insecure) << "a shipped config must not opt out of security";
    if (!IsLoopback(o.listen)) {
      EXPECT_TRUE(o.tls.enabled() && o.auth.enabled()) << o.listen;
    }
    std::string device_pool;
    for (PoolOptions& pool : o.store.pools) {
      pool.capacity_bytes = std::min<int64_t>(pool.capacity_bytes, int64_t{64} << 20);
      if (pool.device != "cpu" && device_pool.empty()) device_pool = pool.name;
    }
    if (device_pool.empty() || CudaDeviceUsable()) {
      KVC_EXPECT_OK(KvStore::Create(o.store).status());
    } else {
      // Where there is no GPU (or no CUDA in the build) a device pool is the startup error
      // that names the pool and says why, not a crash.
      EXPECT_THAT(
          KvStore::Create(o.store).status(),
          StatusIs(absl::StatusCode::kFailedPrecondition,
                   absl::StrCat("pool '", device_pool, "': device 'cuda:0' cannot be used")));
      ++refused;
    }
  }
  EXPECT_GE(checked, 3);
  std::printf("%d shipped configs loaded; %d with a device pool refused (no usable CUDA device)\n",
              checked, refused);
}

TEST(ServerConfigTest, ParsesSecurityAndRefusesInconsistentSettings) {
  KVC_ASSERT_OK_AND_ASSIGN(
      ServerOptions o, ParseServerConfig(R"pb(
        listen: "0.0.0.0:50051"
        pools {
          name: "p"
          capacity_bytes: 1048576
          geometry { num_layers: 1 num_kv_heads: 1 num_query_heads: 1 head_dim: 64 }
        }
        tls { cert_file: "/c" key_file: "/k" client_ca_file: "/ca" require_client_cert: true }
        auth {
          tokens_file: "/t"
          client_identities { san: "spiffe://x/a" tenant: "a" role: ROLE_ADMIN }
        }
        quotas { tenant: "a" max_bytes_per_pool: 1024 max_sequences: 2 }
        quotas { tenant: "*" max_streams: 4 }
        verify_shared_reads_every: 1
      )pb"));
  EXPECT_TRUE(o.tls.enabled());
  EXPECT_TRUE(o.tls.require_client_cert);
  EXPECT_EQ(o.tls.reload_interval_seconds, 60);
  ASSERT_EQ(o.auth.client_identities.size(), 1u);
  EXPECT_EQ(o.auth.client_identities[0].role, Role::kAdmin);
  ASSERT_EQ(o.store.quotas.size(), 2u);
  EXPECT_EQ(QuotaFor(o.store.quotas, "a").max_sequences, 2);
  EXPECT_EQ(QuotaFor(o.store.quotas, "zz").max_streams, 4);
  EXPECT_EQ(o.store.verify_shared_reads_every, 1);
  KVC_EXPECT_OK(CheckExposure(o));

  const std::string pool =
      R"pb(pools {
             name: "p"
             capacity_bytes: 1048576
             geometry { num_layers: 1 num_kv_heads: 1 num_query_heads: 1 head_dim: 64 }
           })pb";
  for (const char* bad : {
           R"pb(tls { cert_file: "/c" })pb",
           R"pb(tls { client_ca_file: "/ca" })pb",
           R"pb(tls { cert_file: "/c" key_file: "/k" require_client_cert: true })pb",
           R"pb(auth { client_identities { san: "x" tenant: "a" } })pb",
           R"pb(tls { cert_file: "/c" key_file: "/k" client_ca_file: "/ca" }
                auth { client_identities { san: "x" tenant: "a/b" } })pb",
           R"pb(quotas { tenant: "a" max_sequences: -1 })pb",
           R"pb(verify_shared_reads_every: -1)pb",
           R"pb(quotas { tenant: "a" }
                quotas { tenant: "a" })pb",
           R"pb(auth { tokens_file: "/t" reload_interval_seconds: 100000 })pb",
       }) {
    EXPECT_EQ(ParseServerConfig(pool + bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  KVC_ASSERT_OK_AND_ASSIGN(ServerOptions open,
                           ParseServerConfig(pool + R"pb(listen: "0.0.0.0:1")pb"));
  EXPECT_EQ(CheckExposure(open).code(), absl::StatusCode::kFailedPrecondition);
  for (const char* local : {"127.0.0.1:1", "localhost:1", "[::1]:1", "unix:/tmp/k.sock"}) {
    open.listen = local;
    KVC_EXPECT_OK(CheckExposure(open)) << local;
  }
  open.listen = "10.0.0.5:1";
  open.insecure = true;
  KVC_EXPECT_OK(CheckExposure(open));
}

}  // namespace
}  // namespace kvc::cachesvc
