// The peers' worst bugs were wrong KV served as a hit from lifecycle gaps, not from math
// (docs/ARCHITECTURE.md "Errors"; each named below). Each is tried here on every read path a
// client has (gRPC, the mapped pool, a transfer channel), through the real client and server,
// and every read is checked against the KV it should be, not only against another path:
//  - prompts an exact multiple of the block size (LMCache #5151): stored, published, looked
//    up, attached and read whole, no token lost or repeated at the block edge;
//  - a failed or partial store is never visible (LMCache #4991): tokens appear only when every
//    layer has them, a refused append leaves nothing, a failed stream keeps exactly the
//    messages before it, a prefix publishes only whole appended blocks;
//  - cancelled and timed-out appends never mix into another request's KV (SGLang #23392,
//    TensorRT-LLM PR #15546: a reused buffer): staged appends with deadlines that expire
//    while the server may still be reading their staging slot, retried from what the server
//    says it has.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/read_paths.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using testing::kDim;
using testing::kHeads;
using testing::kLayers;
constexpr int kBlock = 16;  // the small test pool's block_tokens

// What Fetch must return for sequence data `seed`: per (layer, head), `n` f16 rows.
void ExpectHolds(const client::FetchResult& r, uint32_t seed, int64_t n, const std::string& why) {
  SCOPED_TRACE(why);
  ASSERT_EQ(r.visible_tokens, n);
  ASSERT_EQ(r.heads.size(), n == 0 ? 0u : static_cast<size_t>(kLayers * kHeads));
  for (const client::FetchedHead& h : r.heads) {
    SCOPED_TRACE(::testing::Message() << "layer " << h.layer << " head " << h.kv_head);
    ASSERT_EQ(h.positions.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h.positions[static_cast<size_t>(i)], i);
    EXPECT_TRUE(h.keys == testing::MakeHeadKv(seed, h.layer, h.kv_head, 0, n, kDim,
                                              kernels::DType::kF16, /*is_value=*/false))
        << "keys are not the sequence's own";
    EXPECT_TRUE(h.values == testing::MakeHeadKv(seed, h.layer, h.kv_head, 0, n, kDim,
                                                kernels::DType::kF16, /*is_value=*/true))
        << "values are not the sequence's own";
  }
}

// Appends [start, start + n) of sequence data `seed` to one layer.
absl::StatusOr<client::AppendResult> AppendRange(client::KvCacheClient& c, const std::string& id,
                                                 uint32_t seed, int layer, int64_t start, int n,
                                                 const client::CallOptions& call = {}) {
  const std::string k = testing::MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16,
                                        /*is_value=*/false);
  const std::string v =
      testing::MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/true);
  client::AppendChunk a;
  a.sequence_id = id;
  a.layer = layer;
  a.start_position = start;
  a.num_tokens = n;
  a.dtype = client::DType::kF16;
  a.keys = k.data();
  a.values = v.data();
  a.bytes = k.size();
  return c.Append(a, call);
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvc-lifecycle-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    server_ = {};
    std::filesystem::remove_all(dir_);
  }
  void Start(int64_t capacity = int64_t{64} << 20) {
    cachesvc::ServerOptions o = testing::SmallServerOptions(capacity);
    o.store.pools[0].device = "cpu";
    o.local_socket = dir_ + "/kvcached.sock";
    o.local_socket_allow_same_uid = true;  // the test is the engine, as kvcached's uid
    o.transfer_listen = "127.0.0.1:0";
    server_ = testing::StartTestServer(o);
    grpc_ = Client(/*local=*/false, /*transfers=*/false);
    mapped_ = Client(/*local=*/true, /*transfers=*/false);
    transfer_ = Client(/*local=*/false, /*transfers=*/true);
  }
  std::unique_ptr<client::KvCacheClient> Client(bool local, bool transfers) const {
    client::ClientOptions o;
    o.target = server_.server->address();
    o.local_reads = local;
    o.transfers = transfers;
    return *client::KvCacheClient::Connect(o);
  }
  // Every path's Fetch of `id` holds exactly `n` tokens of data `seed`.
  void ExpectEveryPathHolds(const std::string& id, uint32_t seed, int64_t n,
                            const std::string& why) {
    for (client::KvCacheClient* c : {grpc_.get(), mapped_.get(), transfer_.get()}) {
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult r, c->Fetch(id, {}));
      ExpectHolds(r, seed, n, absl::StrCat(why, " via ", c->DataPath()));
    }
  }

  std::string dir_;
  testing::TestServer server_;
  std::unique_ptr<client::KvCacheClient> grpc_, mapped_, transfer_;
};

TEST_F(LifecycleTest, PromptsThatAreAnExactMultipleOfTheBlockAreServedWhole) {
  ASSERT_NO_FATAL_FAILURE(Start());
  for (const int n : {kBlock, 2 * kBlock, 4 * kBlock}) {
    for (const int chunk : {n, kBlock, 5}) {  // one append, block-sized ones, ragged ones
      SCOPED_TRACE(::testing::Message() << n << " tokens in chunks of " << chunk);
      const auto seed = static_cast<uint32_t>(n * 100 + chunk);
      KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo s, grpc_->CreateSequence({}));
      for (int layer = 0; layer < kLayers; ++layer) {
        for (int at = 0; at < n; at += chunk) {
          KVC_ASSERT_OK(AppendRange(*grpc_, s.sequence_id, seed, layer, at, std::min(chunk, n - at))
                            .status());
        }
      }
      ExpectEveryPathHolds(s.sequence_id, seed, n, "stored");

      // Published under token ids of exactly n: looked up and attached whole, and n + 1 ids
      // find n (the extra token is not cached), never more.
      client::Prefix prefix{"lifecycle-model", absl::StrCat("salt-", seed), {}};
      for (int i = 0; i < n; ++i) prefix.token_ids.push_back(1000 + i);
      KVC_ASSERT_OK_AND_ASSIGN(const client::PublishResult published,
                               grpc_->PublishPrefix(s.sequence_id, prefix));
      EXPECT_EQ(published.published_tokens, n);
      KVC_ASSERT_OK_AND_ASSIGN(const int64_t cached, grpc_->LookupPrefix("", prefix));
      EXPECT_EQ(cached, n);
      client::Prefix longer = prefix;
      longer.token_ids.push_back(7);
      KVC_ASSERT_OK_AND_ASSIGN(const int64_t cached_longer, grpc_->LookupPrefix("", longer));
      EXPECT_EQ(cached_longer, n);
      client::CreateSequenceOptions attach;
      attach.prefix = longer;
      KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo attached, grpc_->CreateSequence(attach));
      EXPECT_EQ(attached.attached_tokens, n);
      ExpectEveryPathHolds(attached.sequence_id, seed, n, "attached");
      // The attached sequence goes on from the block edge with its own tokens.
      for (int layer = 0; layer < kLayers; ++layer) {
        KVC_ASSERT_OK(AppendRange(*grpc_, attached.sequence_id, seed, layer, n, 3).status());
      }
      ExpectEveryPathHolds(attached.sequence_id, seed, n + 3, "attached, then appended");
      ExpectEveryPathHolds(s.sequence_id, seed, n, "the published one, unchanged");
    }
  }
}

TEST_F(LifecycleTest, AFailedOrPartialStoreIsNeverVisible) {
  // A pool of 20 blocks (one block: 16 tokens of one (layer, kv head), K and V, f16): 32
  // tokens on every layer take 16 of them; an append of 640 tokens to one layer does not fit.
  const int64_t block = kBlock * 2 * kDim * 2;
  ASSERT_NO_FATAL_FAILURE(Start(int64_t{20} * block));
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo s, grpc_->CreateSequence({}));
  for (int layer = 0; layer < kLayers - 1; ++layer) {
    KVC_ASSERT_OK(AppendRange(*grpc_, s.sequence_id, 9, layer, 0, 2 * kBlock).status());
  }
  ExpectEveryPathHolds(s.sequence_id, 9, 0, "three of four layers: nothing visible");
  client::Prefix prefix{"lifecycle-model", "partial", {}};
  for (int i = 0; i < 2 * kBlock; ++i) prefix.token_ids.push_back(i);
  KVC_ASSERT_OK_AND_ASSIGN(const client::PublishResult early,
                           grpc_->PublishPrefix(s.sequence_id, prefix));
  EXPECT_EQ(early.published_tokens, 0) << "a layer without the tokens publishes none";
  KVC_ASSERT_OK_AND_ASSIGN(int64_t cached, grpc_->LookupPrefix("", prefix));
  EXPECT_EQ(cached, 0);

  // The last layer asks for more than the pool has: refused whole, nothing of it stored.
  EXPECT_THAT(AppendRange(*grpc_, s.sequence_id, 9, kLayers - 1, 0, 40 * kBlock).status(),
              testing::StatusIs(absl::StatusCode::kResourceExhausted));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo after, grpc_->GetSequence(s.sequence_id));
  EXPECT_EQ(after.layer_tokens[kLayers - 1], 0);
  ExpectEveryPathHolds(s.sequence_id, 9, 0, "after the refused append");

  // A stream whose third message is refused keeps the two before it, nothing after.
  std::unique_ptr<client::AppendStream> stream = grpc_->StartAppendStream();
  const std::string k = testing::MakeKv(9, kLayers - 1, 0, kBlock, kHeads, kDim,
                                        kernels::DType::kF16, /*is_value=*/false);
  const std::string v = testing::MakeKv(9, kLayers - 1, 0, kBlock, kHeads, kDim,
                                        kernels::DType::kF16, /*is_value=*/true);
  const std::string k2 = testing::MakeKv(9, kLayers - 1, kBlock, kBlock, kHeads, kDim,
                                         kernels::DType::kF16, /*is_value=*/false);
  const std::string v2 = testing::MakeKv(9, kLayers - 1, kBlock, kBlock, kHeads, kDim,
                                         kernels::DType::kF16, /*is_value=*/true);
  client::AppendChunk a{s.sequence_id,       kLayers - 1, 0,        kBlock,
                        client::DType::kF16, k.data(),    v.data(), k.size()};
  client::AppendChunk b{s.sequence_id,       kLayers - 1, kBlock,    kBlock,
                        client::DType::kF16, k2.data(),   v2.data(), k2.size()};
  client::AppendChunk bad = b;
  bad.start_position = 5 * kBlock;  // out of order
  KVC_ASSERT_OK(stream->Write(a));
  KVC_ASSERT_OK(stream->Write(b));
  (void)stream->Write(bad);
  (void)stream->Write(a);
  EXPECT_THAT(stream->Finish().status(), testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                                           "the 2 earlier messages were applied"));
  ExpectEveryPathHolds(s.sequence_id, 9, 2 * kBlock, "the stream's two applied messages");
  KVC_ASSERT_OK_AND_ASSIGN(const client::PublishResult later,
                           grpc_->PublishPrefix(s.sequence_id, prefix));
  EXPECT_EQ(later.published_tokens, 2 * kBlock);
}

// Threads append to sequences of their own through the staging region, with deadlines so
// short that many calls end before the server answered (it may still be reading the slot).
// After a failed call a writer asks the server how far the layer got and goes on from there,
// as an engine would. Every sequence ends up holding exactly its own KV: no slot the server
// might still read was given to another append.
TEST_F(LifecycleTest, CancelledAppendsNeverMixIntoAnotherSequence) {
  ASSERT_NO_FATAL_FAILURE(Start(int64_t{256} << 20));
  constexpr int kWriters = 4, kPerWriter = 3, kTokens = 32 * kBlock;
  EXPECT_EQ(mapped_->AppendPath(), "grpc (no Append yet)");
  std::vector<std::string> ids;
  ids.reserve(kWriters * kPerWriter);
  for (int i = 0; i < kWriters * kPerWriter; ++i) {
    KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo s, mapped_->CreateSequence({}));
    ids.push_back(s.sequence_id);
  }
  std::atomic<int> failed{0};
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937 rng(static_cast<uint32_t>(w));
      for (int round = 0; round < 800; ++round) {
        const int which = w * kPerWriter + static_cast<int>(rng() % kPerWriter);
        const std::string& id = ids[static_cast<size_t>(which)];
        const auto seed = static_cast<uint32_t>(1000 + which);
        absl::StatusOr<client::SequenceInfo> info = mapped_->GetSequence(id);
        if (!info.ok()) continue;
        const int layer = static_cast<int>(rng() % kLayers);
        const int64_t at = info->layer_tokens[static_cast<size_t>(layer)];
        if (at >= kTokens) continue;
        const int n = static_cast<int>(std::min<int64_t>(1 + rng() % 40, kTokens - at));
        client::CallOptions call;
        call.deadline = absl::Microseconds(1 + static_cast<int64_t>(rng() % 1500));
        if (!AppendRange(*mapped_, id, seed, layer, at, n, call).ok()) ++failed;
      }
    });
  }
  for (std::thread& t : writers) t.join();
  // Finish every sequence without deadlines.
  for (size_t i = 0; i < ids.size(); ++i) {
    KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo info, grpc_->GetSequence(ids[i]));
    for (int layer = 0; layer < kLayers; ++layer) {
      const int64_t at = info.layer_tokens[static_cast<size_t>(layer)];
      if (at < kTokens) {
        KVC_ASSERT_OK(AppendRange(*mapped_, ids[i], static_cast<uint32_t>(1000 + i), layer, at,
                                  static_cast<int>(kTokens - at))
                          .status());
      }
    }
  }
  EXPECT_THAT(mapped_->AppendPath(), ::testing::StartsWith("staged"));
  EXPECT_GT(failed.load(), 0) << "no deadline expired: the test tried nothing";
  for (size_t i = 0; i < ids.size(); ++i) {
    ExpectEveryPathHolds(ids[i], static_cast<uint32_t>(1000 + i), kTokens,
                         absl::StrCat("sequence ", i));
  }
}

}  // namespace
}  // namespace kvc
