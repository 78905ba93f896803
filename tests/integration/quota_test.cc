// Per-tenant limits and the exposure rules through an in-process kvcached (auth_fixture.h):
// bytes per pool, live sequences, open streams, compute slots, the tokens file's format, and
// which listen addresses need TLS and authentication.
#include "tests/integration/auth_fixture.h"

namespace kvc::cachesvc {
namespace {

using namespace auth_testing;  // NOLINT(google-build-using-namespace): the suites' fixture

class QuotaTest : public AuthTest {
 protected:
  // 16 tokens on every layer of the small pool = 8 blocks of 2 KiB (f16).
  static constexpr int64_t kChunkBytes = 8 * 2048;
  void SetUp() override { Start({{"a", 4 * kChunkBytes, 3, 2, 0}, {"*", 0, 0, 0, 0}}); }
};

TEST_F(QuotaTest, BytesPerPoolStopAtTheQuotaWithNothingHalfWrittenAndReleaseGivesThemBack) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  int64_t tokens = 0;
  while (AppendAll(kTokenA, "doc", tokens, 16).ok()) tokens += 16;
  EXPECT_EQ(tokens, 64) << "4 chunks fit the quota";
  // The refused layer-0 append left everything as it was.
  std::string before;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &before).ok());
  const int64_t used = server_->store()->stats().GetPoolStats("").value().used_bytes;
  const grpc::Status refused = Append(kTokenA, "doc", 0, tokens, 16);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("quota"));
  EXPECT_THAT(refused.error_message(), HasSubstr("max_bytes_per_pool 65536"));
  std::string after;
  ASSERT_TRUE(Fetch(kTokenA, "doc", &after).ok());
  EXPECT_EQ(before, after);
  EXPECT_EQ(server_->store()->stats().GetPoolStats("").value().used_bytes, used);
  pb::GetSequenceRequest get;
  get.set_sequence_id("doc");
  pb::SequenceInfo info;
  ASSERT_TRUE(kv_->GetSequence(Ctx(kTokenA).get(), get, &info).ok());
  EXPECT_EQ(info.visible_tokens(), 64);

  // Another tenant is not starved by a's quota.
  ASSERT_TRUE(Create(kTokenB, "doc").ok());
  EXPECT_TRUE(AppendAll(kTokenB, "doc", 0, 16 * 6).ok());

  // Compressing shrinks what a holds, although the conversion needs both copies at once:
  // the quota counts the result.
  pb::CompressRequest compress;
  compress.set_sequence_id("doc");
  compress.mutable_spec()->set_storage(pb::STORAGE_FORMAT_INT4_G32);
  pb::CompressResponse compressed;
  ASSERT_TRUE(kv_->Compress(Ctx(kTokenA).get(), compress, &compressed).ok());
  pb::PoolStats stats;
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &stats).ok());
  EXPECT_LT(stats.used_bytes(), 4 * kChunkBytes / 2);
  EXPECT_EQ(stats.quota_bytes(), 4 * kChunkBytes);

  // Release gives the quota back exactly.
  pb::ReleaseRequest release;
  release.set_sequence_id("doc");
  pb::ReleaseResponse released;
  ASSERT_TRUE(kv_->Release(Ctx(kTokenA).get(), release, &released).ok());
  ASSERT_TRUE(admin_->GetPoolStats(Ctx(kTokenA).get(), {}, &stats).ok());
  EXPECT_EQ(stats.used_bytes(), 0);
  EXPECT_EQ(stats.sequences(), 0);
  ASSERT_TRUE(Create(kTokenA, "doc2").ok());
  EXPECT_TRUE(AppendAll(kTokenA, "doc2", 0, 64).ok());
}

TEST_F(QuotaTest, LiveSequencesStopAtTheQuota) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Create(kTokenA, absl::StrCat("s", i)).ok());
  const grpc::Status refused = Create(kTokenA, "s3");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("max_sequences 3"));
  EXPECT_TRUE(Create(kTokenB, "s3").ok()) << "b has no limit";
  pb::ReleaseRequest release;
  release.set_sequence_id("s0");
  pb::ReleaseResponse released;
  ASSERT_TRUE(kv_->Release(Ctx(kTokenA).get(), release, &released).ok());
  EXPECT_TRUE(Create(kTokenA, "s3").ok());
}

TEST_F(QuotaTest, OpenStreamsStopAtTheQuotaAndFreeTheirSlotWhenTheyEnd) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  // Two AppendStreams held open (max_streams 2): the server handler holds its slot while it
  // waits for the next message.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<pb::AppendRequest>>> open;
  pb::AppendStreamResponse responses[3];
  for (int i = 0; i < 2; ++i) {
    contexts.push_back(Ctx(kTokenA));
    open.push_back(kv_->AppendStream(contexts.back().get(), &responses[i]));
    ASSERT_TRUE(open.back()->Write(AppendReq("doc", i, 0, 16, 1)));
  }
  // Wait until both handlers run (their first message is applied).
  for (int i = 0; i < 100; ++i) {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    pb::SequenceInfo info;
    ASSERT_TRUE(kv_->GetSequence(Ctx(kTokenA).get(), r, &info).ok());
    if (info.layer_tokens(0) == 16 && info.layer_tokens(1) == 16) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string data;
  const grpc::Status third = Fetch(kTokenA, "doc", &data);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.error_message(), HasSubstr("max_streams 2"));
  EXPECT_TRUE(Fetch(kTokenB, "nope", &data).error_code() == grpc::StatusCode::NOT_FOUND)
      << "b's streams are not a's";
  for (auto& w : open) {
    w->WritesDone();
    EXPECT_TRUE(w->Finish().ok());
  }
  EXPECT_TRUE(Fetch(kTokenA, "doc", &data).ok());
  EXPECT_THAT(testing::HttpGet(server_->metrics_address(), "/metrics"),
              HasSubstr("kvc_tenant_call_limit_refusals_total{limit=\"streams\",tenant=\"a\"} 1"));
}

TEST(CallLimitsTest, ComputeSlotsAreCountedPerTenantAndReturnedByScope) {
  CallLimits limits({{"a", 0, 0, 0, 2}});
  auto s1 = limits.Acquire("a", CallKind::kCompute);
  auto s2 = limits.Acquire("a", CallKind::kCompute);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto s3 = limits.Acquire("a", CallKind::kCompute);
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s3.status().message()), HasSubstr("max_compute_calls 2"));
  EXPECT_TRUE(limits.Acquire("b", CallKind::kCompute).ok());
  EXPECT_TRUE(limits.Acquire("a", CallKind::kStream).ok());
  EXPECT_EQ(limits.InFlight("a", CallKind::kCompute), 2);
  { auto released = std::move(s1); }
  EXPECT_EQ(limits.InFlight("a", CallKind::kCompute), 1);
  EXPECT_TRUE(limits.Acquire("a", CallKind::kCompute).ok());
  EXPECT_TRUE(limits.Acquire("", CallKind::kCompute).ok()) << "no tenant: not limited";
}

TEST(TokensFileTest, ParsesLinesAndNamesTheBadOne) {
  const std::string salt = "0123456789abcdef";
  auto ok = ParseTokensFile("# comment\n\n a tenant " + ToHex(salt) + " " +
                            TokenHashHex(salt, "t") + "  # trailing\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].tenant, "a");
  const std::string hash = TokenHashHex(salt, "t");
  const std::string hex_salt = ToHex(salt);
  for (const std::string& bad :
       {absl::StrCat("a tenant ", hex_salt), absl::StrCat("a root ", hex_salt, " ", hash),
        absl::StrCat("a/b tenant ", hex_salt, " ", hash), absl::StrCat("a tenant zz ", hash),
        absl::StrCat("a tenant ", hex_salt, " abcd"), absl::StrCat("a tenant 00 ", hash)}) {
    auto parsed = ParseTokensFile("# ok\n" + bad + "\n");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("line 2")) << bad;
  }
}

TEST(ExposureTest, NonLoopbackListenNeedsTlsAndAuthenticationOrAnExplicitOptOut) {
  ServerOptions options = testing::SmallServerOptions();
  options.listen = "0.0.0.0:0";
  auto refused = KvCacheServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("insecure: true"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("TLS"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("authentication"));
  TempDir dir;
  options.auth.tokens_file = dir.path() + "/tokens";
  std::ofstream(options.auth.tokens_file) << TokenLine("a", "tenant", kTokenA);
  refused = KvCacheServer::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << "tokens over plaintext on the network";
  options.insecure = true;
  auto started = KvCacheServer::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  options.insecure = false;
  options.auth = {};
  options.listen = "127.0.0.1:0";
  EXPECT_TRUE(KvCacheServer::Start(options).ok()) << "loopback: the developer default";
  options.listen = "[::1]:0";
  auto v6 = KvCacheServer::Start(options);
  EXPECT_NE(v6.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExposureTest, AMissingOrBrokenTokensFileStopsStartup) {
  ServerOptions options = testing::SmallServerOptions();
  options.auth.tokens_file = "/nonexistent/tokens";
  auto missing = KvCacheServer::Start(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/tokens"));
  TempDir dir;
  options.auth.tokens_file = dir.path() + "/tokens";
  std::ofstream(options.auth.tokens_file) << "a tenant\n";
  auto broken = KvCacheServer::Start(options);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("line 1"));
}

TEST(UnauthenticatedTest, WithoutAuthTenantLabelsAreFreeTextAndSummedInMetrics) {
  ServerOptions options = testing::SmallServerOptions();
  options.metrics_listen = "127.0.0.1:0";
  options.store.quotas = {{"named", 0, 1, 0, 0}};
  auto t = testing::StartTestServer(options);
  for (const std::string tenant : {"x1", "x2", "named"}) {
    client::CreateSequenceOptions create;
    create.tenant = tenant;
    ASSERT_TRUE(t.client->CreateSequence(create).ok());
  }
  client::CreateSequenceOptions again;
  again.tenant = "named";
  EXPECT_EQ(t.client->CreateSequence(again).status().code(), absl::StatusCode::kResourceExhausted)
      << "memory quotas apply to tenant labels without authentication too";
  const std::string metrics = testing::HttpGet(t.server->metrics_address(), "/metrics");
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_sequences{tenant=\"_other\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("kvc_tenant_sequences{tenant=\"named\"} 1"));
  EXPECT_THAT(metrics, ::testing::Not(HasSubstr("tenant=\"x1\"")));
}

}  // namespace
}  // namespace kvc::cachesvc
