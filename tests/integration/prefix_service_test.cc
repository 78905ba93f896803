// The prefix cache through the real client and gRPC server: an engine publishes a prefilled
// document, a second request attaches it and appends only its question, both read the same
// bytes; lookups, hit rate and cache bytes show in GetPoolStats and Prometheus; a corrupt
// shared block is refused with DATA_LOSS; the errors a caller gets name the field.
#include <grpcpp/grpcpp.h>

#include <numeric>
#include <utility>

#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "tests/testing/http_get.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::MetricSample;

using ::kvc::testing::MakeKv;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 4, kHeads = 2, kDim = 32;

std::vector<int32_t> Ids(int n, int32_t first) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

client::Prefix Doc(std::vector<int32_t> ids) {
  return client::Prefix{"smollm2-135m", "", std::move(ids)};
}

absl::Status Prefill(client::KvCacheClient& c, const std::string& id, int64_t start, int n,
                     uint32_t seed) {
  for (int l = 0; l < kLayers; ++l) {
    const std::string k = MakeKv(seed, l, start, n, kHeads, kDim, kernels::DType::kF16,
                                 /*is_value=*/false);
    const std::string v = MakeKv(seed, l, start, n, kHeads, kDim, kernels::DType::kF16,
                                 /*is_value=*/true);
    client::AppendChunk a;
    a.sequence_id = id;
    a.layer = l;
    a.start_position = start;
    a.num_tokens = n;
    a.dtype = client::DType::kF16;
    a.keys = k.data();
    a.values = v.data();
    a.bytes = k.size();
    auto r = c.Append(a);
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

// Dense keys and values of every head's tokens at positions < limit.
std::vector<std::string> Heads(client::KvCacheClient& c, const std::string& id, int32_t limit) {
  auto fetched = c.Fetch(id, {});
  EXPECT_TRUE(fetched.ok()) << fetched.status();
  std::vector<std::string> out;
  if (!fetched.ok()) return out;
  for (const client::FetchedHead& h : fetched->heads) {
    const size_t row = h.keys.size() / h.positions.size();
    std::string s;
    for (size_t i = 0; i < h.positions.size(); ++i) {
      if (h.positions[i] < limit) s += h.keys.substr(i * row, row) + h.values.substr(i * row, row);
    }
    out.push_back(s);
  }
  return out;
}

TEST(PrefixServiceTest, SecondRequestAttachesTheDocumentAndAppendsOnlyItsQuestion) {
  auto options = ::kvc::testing::SmallServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  auto t = ::kvc::testing::StartTestServer(options);
  client::KvCacheClient& c = *t.client;
  // Request 1: a 200-token document + a 9-token question; the engine publishes the document.
  const std::vector<int32_t> doc = Ids(200, 1000);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo first, c.CreateSequence({}));
  KVC_ASSERT_OK(Prefill(c, first.sequence_id, 0, 209, 1));
  KVC_ASSERT_OK_AND_ASSIGN(client::PublishResult published,
                           c.PublishPrefix(first.sequence_id, Doc(doc)));
  EXPECT_EQ(published.published_tokens, 192);  // 12 whole blocks of 16
  EXPECT_EQ(published.new_tokens, 192);
  KVC_ASSERT_OK_AND_ASSIGN(published, c.PublishPrefix(first.sequence_id, Doc(doc)));
  EXPECT_EQ(published.new_tokens, 0) << "publishing again adds nothing";
  EXPECT_EQ(*c.LookupPrefix("", Doc(doc)), 192);
  EXPECT_EQ(*c.LookupPrefix("", Doc(Ids(200, 5))), 0);
  EXPECT_EQ(*c.LookupPrefix("", Doc(doc), client::StorageFormat::kInt8), 0);

  // Request 2: the same document, another question.
  const int64_t used_before = kvc::client::AdminClient::Over(c).GetPoolStats("small")->used_bytes;
  client::CreateSequenceOptions o;
  o.prefix = Doc(doc);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo second, c.CreateSequence(o));
  EXPECT_EQ(second.attached_tokens, 192);
  EXPECT_EQ(second.visible_tokens, 192);
  EXPECT_EQ(kvc::client::AdminClient::Over(c).GetPoolStats("small")->used_bytes, used_before)
      << "nothing copied";
  KVC_ASSERT_OK(Prefill(c, second.sequence_id, 192, 20, 2));
  EXPECT_EQ(Heads(c, second.sequence_id, 192), Heads(c, first.sequence_id, 192));
  EXPECT_EQ(c.GetSequence(second.sequence_id)->visible_tokens, 212);

  // The first request ends; its document stays cached and the next request still hits.
  KVC_ASSERT_OK(c.Release(first.sequence_id));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo third, c.CreateSequence(o));
  EXPECT_EQ(third.attached_tokens, 192);

  KVC_ASSERT_OK_AND_ASSIGN(client::PoolStats stats,
                           kvc::client::AdminClient::Over(c).GetPoolStats("small"));
  EXPECT_EQ(stats.prefix_cache.lookups, 5);  // 3 lookups + 2 attaches
  EXPECT_EQ(stats.prefix_cache.hits, 3);
  EXPECT_EQ(stats.prefix_cache.hit_tokens, 3 * 192);
  EXPECT_EQ(stats.prefix_cache.lookup_tokens, 5 * 192);
  EXPECT_EQ(stats.prefix_cache.attached_tokens, 2 * 192);
  EXPECT_EQ(stats.prefix_cache.entries, 12);
  // 12 entries x 4 layers x 2 heads x one f16 block (16 x 32 x 2 bytes x K,V).
  EXPECT_EQ(stats.prefix_cache.cached_bytes, 12 * 8 * 2048);
  EXPECT_EQ(stats.prefix_cache.unreferenced_bytes, 0);

  const std::string response = ::kvc::testing::HttpGet(t.server->metrics_address(), "/metrics");
  const std::string body = response.substr(response.find("\r\n\r\n") + 3);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_lookup_tokens_total{pool="small",result="hit"})"),
            3 * 192);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_lookup_tokens_total{pool="small",result="miss"})"),
            2 * 192);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_misses_total{pool="small",reason="no_prefix"})"), 2);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_cache_bytes{pool="small",state="shared"})"),
            12 * 8 * 2048);
  EXPECT_EQ(
      MetricSample(
          body,
          R"(kvc_rpc_requests_total{code="OK",method="PublishPrefix",service="KvCacheService"})"),
      2);
}

// A document compressed once (StreamingLLM + INT4: what a query-agnostic compression of a
// long document looks like to the service) is forked once per question: each fork appends
// its own question; the document's bytes stay the same for everyone, and the pool holds one
// compressed document plus each fork's last blocks and question.
TEST(PrefixServiceTest, ACompressedDocumentIsForkedPerQuestionCopyOnWrite) {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions());
  client::KvCacheClient& c = *t.client;
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo doc, c.CreateSequence({}));
  KVC_ASSERT_OK(Prefill(c, doc.sequence_id, 0, 300, 1));
  KVC_ASSERT_OK_AND_ASSIGN(
      client::CompressResult compressed,
      c.Compress(doc.sequence_id, client::CompressionSpec::StreamingLlm(4, 100).WithStorage(
                                      client::StorageFormat::kInt4G32)));
  EXPECT_EQ(compressed.sequence.visible_tokens, 300);
  const std::vector<std::string> doc_heads = Heads(c, doc.sequence_id, 1 << 30);
  const int64_t used = kvc::client::AdminClient::Over(c).GetPoolStats("small")->used_bytes;
  std::vector<std::string> forks;
  for (int q = 0; q < 3; ++q) {
    KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo f,
                             c.ForkSequence(doc.sequence_id, "question-" + std::to_string(q)));
    EXPECT_EQ(f.sequence_id, "question-" + std::to_string(q));
    EXPECT_EQ(f.visible_tokens, 300);
    EXPECT_EQ(f.storage, client::StorageFormat::kInt4G32);
    EXPECT_EQ(f.bytes, compressed.sequence.bytes);
    KVC_ASSERT_OK(Prefill(c, f.sequence_id, 300, 12, 10 + static_cast<uint32_t>(q)));
    forks.push_back(f.sequence_id);
  }
  // 104 tokens kept = 6 whole blocks + 8 tokens on each of the 8 lanes. Each fork copied
  // the partial block and its 12 question tokens filled it and started one more: 2 blocks
  // per lane in the pool, 1 more than the document in the fork's own bytes.
  const int64_t block = compressed.sequence.bytes / (7 * kLayers * kHeads);
  EXPECT_EQ(c.GetSequence(forks[0])->bytes, compressed.sequence.bytes + kLayers * kHeads * block);
  EXPECT_EQ(kvc::client::AdminClient::Over(c).GetPoolStats("small")->used_bytes,
            used + 3 * 2 * kLayers * kHeads * block)
      << "the forks share the document's whole blocks";
  EXPECT_EQ(Heads(c, doc.sequence_id, 1 << 30), doc_heads);
  for (const std::string& f : forks) EXPECT_EQ(Heads(c, f, 300), doc_heads);
  // One fork evicts more; nobody else sees it.
  KVC_ASSERT_OK(c.Compress(forks[0], client::CompressionSpec::StreamingLlm(4, 20)).status());
  EXPECT_EQ(Heads(c, doc.sequence_id, 1 << 30), doc_heads);
  EXPECT_EQ(Heads(c, forks[1], 300), doc_heads);
  // Releasing everything returns every byte.
  for (const std::string& f : forks) KVC_ASSERT_OK(c.Release(f));
  KVC_ASSERT_OK(c.Release(doc.sequence_id));
  EXPECT_EQ(kvc::client::AdminClient::Over(c).GetPoolStats("small")->used_bytes, 0);

  EXPECT_THAT(c.ForkSequence(doc.sequence_id), StatusIs(Code::kNotFound));
  EXPECT_THAT(c.ForkSequence(""), StatusIs(Code::kInvalidArgument, "sequence_id"));
}

// A shared block whose bytes change after publishing (a memory fault, flipped here through
// the pool's backend) is found by a verified read and never served again: the engine gets
// DATA_LOSS with nothing streamed, the cache stops offering the prefix, and operators see it.
TEST(PrefixServiceTest, ACorruptSharedBlockIsRefusedWithDataLoss) {
  auto options = ::kvc::testing::SmallServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  options.store.verify_shared_reads_every = 1;
  auto t = ::kvc::testing::StartTestServer(options);
  client::KvCacheClient& c = *t.client;
  const std::vector<int32_t> doc = Ids(64, 7);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo first, c.CreateSequence({}));
  KVC_ASSERT_OK(Prefill(c, first.sequence_id, 0, 64, 1));
  KVC_ASSERT_OK(c.PublishPrefix(first.sequence_id, Doc(doc)).status());
  client::CreateSequenceOptions o;
  o.prefix = Doc(doc);
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo second, c.CreateSequence(o));
  ASSERT_EQ(second.attached_tokens, 64);
  KVC_ASSERT_OK(c.Fetch(second.sequence_id, {}).status());

  cachesvc::BlockPool* pool = *t.server->store()->leases().FindPool("small");
  const kernels::PagedArena arena = pool->arena(kernels::StorageFormat::kF16);
  ASSERT_TRUE(pool->backend()
                  ->Memset(static_cast<char*>(arena.base) + 10, 0x5a, 1, kernels::StreamHandle{})
                  .ok());
  ASSERT_TRUE(pool->backend()->Synchronize(kernels::StreamHandle{}).ok());
  EXPECT_THAT(c.Fetch(second.sequence_id, {}),
              StatusIs(Code::kDataLoss, "no longer match the checksum"));
  EXPECT_THAT(c.Fetch(first.sequence_id, {}), StatusIs(Code::kDataLoss));
  EXPECT_EQ(*c.LookupPrefix("", Doc(doc)), 0);
  KVC_ASSERT_OK_AND_ASSIGN(client::PoolStats stats,
                           kvc::client::AdminClient::Over(c).GetPoolStats("small"));
  EXPECT_EQ(stats.prefix_cache.corrupt_reads, 2);
  EXPECT_EQ(stats.prefix_cache.checksum_misses, 1);
  const std::string response = ::kvc::testing::HttpGet(t.server->metrics_address(), "/metrics");
  const std::string body = response.substr(response.find("\r\n\r\n") + 3);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_corrupt_reads_total{pool="small"})"), 2);
  EXPECT_EQ(MetricSample(body, R"(kvc_prefix_misses_total{pool="small",reason="checksum"})"), 1);
  // The engine's way out: release and prefill again; the new blocks serve.
  KVC_ASSERT_OK(c.Release(second.sequence_id));
  KVC_ASSERT_OK(c.Release(first.sequence_id));
  KVC_ASSERT_OK_AND_ASSIGN(client::SequenceInfo again, c.CreateSequence(o));
  EXPECT_EQ(again.attached_tokens, 0);
  KVC_ASSERT_OK(Prefill(c, again.sequence_id, 0, 64, 1));
  KVC_ASSERT_OK(c.Fetch(again.sequence_id, {}).status());
}

TEST(PrefixServiceTest, BadRequestsGetTheFieldNamed) {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions());
  client::KvCacheClient& c = *t.client;
  client::CreateSequenceOptions o;
  o.prefix = client::Prefix{"", "", Ids(32, 0)};
  EXPECT_THAT(c.CreateSequence(o), StatusIs(Code::kInvalidArgument, "prefix.model"));
  o.prefix = client::Prefix{"m", "", {1, 2, -5}};
  EXPECT_THAT(c.CreateSequence(o), StatusIs(Code::kInvalidArgument, "prefix.token_ids[2]"));
  o.prefix = Doc(Ids(32, 0));
  o.policy = client::CompressionSpec().WithStorage(client::StorageFormat::kInt4G32);
  o.policy.residual_tokens = 16;
  EXPECT_THAT(c.CreateSequence(o), StatusIs(Code::kFailedPrecondition, "residual"));
  EXPECT_THAT(c.PublishPrefix("s-0000000000000000", Doc(Ids(32, 0))), StatusIs(Code::kNotFound));
  EXPECT_THAT(c.LookupPrefix("nopool", Doc(Ids(32, 0))),
              StatusIs(Code::kNotFound, "pool 'nopool' not found"));
}

}  // namespace
}  // namespace kvc
