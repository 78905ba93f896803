// A client on the server's node outlives a kvcached restart (SIGKILL, then a new process on
// the same port and local socket path): its mapped arenas and staging region belong to the
// dead server, whose memfds stay alive as long as the client maps them. A new server hands out
// the same block ids for new sequences, so a client that kept reading the old mappings would
// serve the old server's KV as the new sequence's: wrong and possibly another tenant's. The
// client must notice the closed socket, decide its same-node path again, and serve exactly
// the new server's bytes; staged appends must work again too.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/kv_cache_client.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/kvcached_process.h"

namespace kvc {
namespace {

using client::DType;
constexpr int kLayers = 2, kHeads = 2, kDim = 32, kTokens = 64;

// Appends kTokens of seed `seed` to every layer of `seq` (staged when the client can).
void Fill(client::KvCacheClient& c, const std::string& seq, uint32_t seed) {
  for (int l = 0; l < kLayers; ++l) {
    const std::string k = testing::MakeKv(seed, l, 0, kTokens, kHeads, kDim, kernels::DType::kF16,
                                          /*is_value=*/false);
    const std::string v =
        testing::MakeKv(seed, l, 0, kTokens, kHeads, kDim, kernels::DType::kF16, /*is_value=*/true);
    client::AppendChunk a;
    a.sequence_id = seq;
    a.layer = l;
    a.num_tokens = kTokens;
    a.dtype = DType::kF16;
    a.keys = k.data();
    a.values = v.data();
    a.bytes = k.size();
    auto r = c.Append(a);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

// Fetch and FetchInto both return exactly seed `seed`'s bytes.
void ExpectHolds(client::KvCacheClient& c, const std::string& seq, uint32_t seed) {
  auto got = c.Fetch(seq, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->heads.size(), size_t{kLayers} * kHeads);
  for (const client::FetchedHead& h : got->heads) {
    EXPECT_TRUE(h.keys == testing::MakeHeadKv(seed, h.layer, h.kv_head, 0, kTokens, kDim,
                                              kernels::DType::kF16, /*is_value=*/false))
        << "Fetch: layer " << h.layer << " head " << h.kv_head << " holds other bytes";
  }
  std::vector<std::string> keys(kLayers, std::string(size_t{kHeads} * kTokens * kDim * 2, '\0'));
  std::vector<std::string> values = keys;
  std::vector<client::LayerBuffers> buffers;
  buffers.reserve(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    buffers.push_back(
        {l, keys[static_cast<size_t>(l)].data(), values[static_cast<size_t>(l)].data(), kTokens});
  }
  auto into = c.FetchInto(seq, buffers, {DType::kF16, kHeads, kDim});
  ASSERT_TRUE(into.ok()) << into.status();
  for (int l = 0; l < kLayers; ++l) {
    std::string want;
    for (int h = 0; h < kHeads; ++h) {
      want += testing::MakeHeadKv(seed, l, h, 0, kTokens, kDim, kernels::DType::kF16,
                                  /*is_value=*/false);
    }
    EXPECT_TRUE(keys[static_cast<size_t>(l)] == want) << "FetchInto: layer " << l;
  }
}

TEST(LocalPathRestartTest, AClientThatOutlivesAServerRestartServesOnlyTheNewServersKv) {
  char tmpl[] = "/tmp/kvc-restart-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::ofstream(dir + "/kvcached.conf")
      << "pools { name: 'p' capacity_bytes: 16777216 geometry { num_layers: " << kLayers
      << " num_kv_heads: " << kHeads << " num_query_heads: 4 head_dim: " << kDim
      << " block_tokens: 16 dtype: DTYPE_F16 } }\n";
  testing::KvcachedProcess server(
      KVCACHED_PATH, dir,
      {"--config=" + dir + "/kvcached.conf", "--listen=127.0.0.1:0", "--metrics_listen=off",
       "--local_socket=" + dir + "/kvcached.sock", "--local_socket_allow_same_uid"});
  ASSERT_FALSE(server.target().empty()) << server.Log();
  client::ClientOptions options;
  options.target = server.target();
  options.max_reconnect_backoff = absl::Milliseconds(200);
  auto connected = client::KvCacheClient::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  client::KvCacheClient& c = **connected;

  auto before = c.CreateSequence({});
  ASSERT_TRUE(before.ok()) << before.status();
  Fill(c, before->sequence_id, /*seed=*/1);
  ExpectHolds(c, before->sequence_id, /*seed=*/1);
  ASSERT_EQ(c.DataPath().rfind("shared-memory", 0), 0u) << c.DataPath();
  ASSERT_EQ(c.AppendPath().rfind("staged", 0), 0u) << c.AppendPath();

  server.Restart();
  ASSERT_FALSE(server.target().empty()) << server.Log();
  // The channel reconnects (GetServerInfo is retried); the old server's sequence is gone.
  ASSERT_TRUE(kvc::client::AdminClient::Over(c).GetServerInfo().ok());
  auto gone = c.Fetch(before->sequence_id, {});
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();

  // The new server's first sequence gets the same block ids the old one had.
  auto after = c.CreateSequence({});
  ASSERT_TRUE(after.ok()) << after.status();
  Fill(c, after->sequence_id, /*seed=*/2);
  ExpectHolds(c, after->sequence_id, /*seed=*/2);
  EXPECT_EQ(c.DataPath().rfind("shared-memory", 0), 0u) << c.DataPath();
  EXPECT_EQ(c.AppendPath().rfind("staged", 0), 0u) << c.AppendPath();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvc
