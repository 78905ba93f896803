// The tokens file changes under a running kvcached (auth_fixture.h): reloads under
// traffic, revoked tokens' open streams, and a Kubernetes Secret volume's symlink swap.
#include "tests/integration/auth_fixture.h"

namespace kvc::cachesvc {
namespace {

using namespace auth_testing;  // NOLINT(google-build-using-namespace): the suites' fixture

TEST_F(AuthTest, TokensFileReloadsUnderTrafficWithoutRestart) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  const std::string new_token = "a-newly-issued-token-0123456789ab";
  std::atomic<bool> stop{false};
  std::atomic<int> ok_calls{0}, failed_calls{0};
  std::thread traffic([&] {
    while (!stop.load()) {
      pb::GetSequenceRequest r;
      r.set_sequence_id("doc");
      pb::SequenceInfo info;
      (kv_->GetSequence(Ctx(kTokenA).get(), r, &info).ok() ? ok_calls : failed_calls)++;
    }
  });
  auto works = [&](const std::string& token) {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    pb::SequenceInfo info;
    return kv_->GetSequence(Ctx(token).get(), r, &info).ok();
  };
  EXPECT_FALSE(works(new_token));
  const int64_t loads = server_->authenticator()->loads();
  // Add a token: picked up by the watcher (1 s interval) without a restart.
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", kTokenA) +
                                    TokenLine("a", "tenant", new_token) +
                                    TokenLine("ops", "admin", kTokenAdmin));
  for (int i = 0; i < 100 && !works(new_token); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(works(new_token));
  EXPECT_GT(server_->authenticator()->loads(), loads);
  // A broken file keeps the tokens in force (and says why in the log).
  WriteAtomically(tokens_file_, "a tenant nothex\n");
  EXPECT_FALSE(server_->ReloadCredentials().ok());
  EXPECT_TRUE(works(new_token));
  stop = true;
  traffic.join();
  // Revoke the old token (the SIGHUP path): refused at once.
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", new_token));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  EXPECT_FALSE(works(kTokenA));
  EXPECT_TRUE(works(new_token));
  EXPECT_GT(ok_calls.load(), 10);
  EXPECT_EQ(failed_calls.load(), 0) << "calls with a valid token failed during the reloads";
}

// A token revoked while streams it opened are still open: each stream ends with
// UNAUTHENTICATED at its next message (AppendStream, AttendStream) or chunk (Fetch), and
// nothing it sent after the reload is applied. A reload that keeps the token ends nothing.
TEST_F(AuthTest, StreamsOfARevokedTokenEndBeforeTheirNextMessage) {
  ASSERT_TRUE(Create(kTokenA, "doc").ok());
  ASSERT_TRUE(Create(kTokenA, "big").ok());
  // 24K tokens x 1 KiB: far more than gRPC's flow-control windows hold, so the Fetch below is
  // still writing when the token is revoked.
  constexpr int kBigTokens = 24 * 1024;
  for (int at = 0; at < kBigTokens; at += 4096)
    ASSERT_TRUE(AppendAll(kTokenA, "big", at, 4096).ok());
  // What tenant a holds, seen by the admin (a's own token is revoked below).
  auto layer_tokens = [&](int layer) -> int64_t {
    pb::GetSequenceRequest r;
    r.set_sequence_id("doc");
    r.set_tenant("a");
    pb::SequenceInfo info;
    EXPECT_TRUE(kv_->GetSequence(Ctx(kTokenAdmin).get(), r, &info).ok());
    return info.layer_tokens(layer);
  };

  auto append_ctx = Ctx(kTokenA);
  append_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::AppendStreamResponse appended;
  auto append = kv_->AppendStream(append_ctx.get(), &appended);
  ASSERT_TRUE(append->Write(AppendReq("doc", 0, 0, 16, 1)));
  for (int i = 0; i < 200 && layer_tokens(0) < 16; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(layer_tokens(0), 16);

  pb::AttendRequest attend;
  attend.set_sequence_id("doc");
  attend.set_layer(0);
  attend.set_queries(std::string(4 * 32 * 2, '\0'));
  attend.add_positions(1000);  // after every token appended meanwhile
  auto attend_ctx = Ctx(kTokenA);
  attend_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto attend_stream = kv_->AttendStream(attend_ctx.get());
  pb::AttendResponse attended;
  ASSERT_TRUE(attend_stream->Write(attend));
  ASSERT_TRUE(attend_stream->Read(&attended));

  pb::FetchRequest fetch;
  fetch.set_sequence_id("big");
  fetch.set_max_chunk_bytes(4096);
  auto fetch_ctx = Ctx(kTokenA);
  fetch_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto fetch_stream = kv_->Fetch(fetch_ctx.get(), fetch);
  pb::FetchChunk chunk;
  ASSERT_TRUE(fetch_stream->Read(&chunk));

  // A reload that keeps a's token: every stream goes on.
  const std::string tokens_b_admin =
      TokenLine("b", "tenant", kTokenB) + TokenLine("ops", "admin", kTokenAdmin);
  WriteAtomically(tokens_file_, TokenLine("a", "tenant", kTokenA) + tokens_b_admin);
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  ASSERT_TRUE(append->Write(AppendReq("doc", 0, 16, 16, 1)));
  ASSERT_TRUE(attend_stream->Write(attend));
  ASSERT_TRUE(attend_stream->Read(&attended)) << "a stream of a valid token was ended";
  ASSERT_TRUE(fetch_stream->Read(&chunk));
  for (int i = 0; i < 200 && layer_tokens(0) < 32; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(layer_tokens(0), 32);

  // Revoke it (the SIGHUP path); the streams keep sending.
  WriteAtomically(tokens_file_, tokens_b_admin);
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  for (int i = 0; i < 4; ++i) {
    if (!append->Write(AppendReq("doc", i % 2, i < 2 ? 32 : 0, 16, 1))) break;
  }
  append->WritesDone();
  const grpc::Status append_end = append->Finish();
  EXPECT_EQ(append_end.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << append_end.error_message();
  EXPECT_THAT(append_end.error_message(), HasSubstr("the credential was revoked"));
  EXPECT_THAT(append_end.error_message(), HasSubstr("applied 2 messages"));
  EXPECT_EQ(layer_tokens(0), 32) << "a message sent after the revocation was applied";
  EXPECT_EQ(layer_tokens(1), 0) << "a message sent after the revocation was applied";

  attend_stream->Write(attend);
  attend_stream->WritesDone();
  EXPECT_FALSE(attend_stream->Read(&attended)) << "an Attend after the revocation was answered";
  const grpc::Status attend_end = attend_stream->Finish();
  EXPECT_EQ(attend_end.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << attend_end.error_message();

  int64_t fetched = 2;
  while (fetch_stream->Read(&chunk)) ++fetched;
  const grpc::Status fetch_end = fetch_stream->Finish();
  EXPECT_EQ(fetch_end.error_code(), grpc::StatusCode::UNAUTHENTICATED) << fetch_end.error_message();
  // A chunk holds 4 KiB of keys and values: 32 tokens of one (layer, kv head) lane.
  EXPECT_LT(fetched, int64_t{kBigTokens} / 32 * 4 * 2) << "the Fetch was served to its end";
  std::printf("chunks fetched before the revocation ended the Fetch: %lld\n",
              static_cast<long long>(fetched));
}

// A Kubernetes Secret volume: `tokens` -> `..data/tokens`, `..data` -> a timestamped
// directory; an update writes a new directory and renames a new `..data` link over the old
// one, so the file at `tokens` changes without ever being written or renamed itself.
TEST(SecretVolumeTest, TokensFileReloadsWhenTheKubeletSwapsTheDataSymlink) {
  TempDir dir;
  namespace fs = std::filesystem;
  auto publish = [&](const std::string& version, const std::string& text) {
    fs::create_directory(dir.path() + "/" + version);
    std::ofstream(dir.path() + "/" + version + "/tokens") << text;
    fs::create_directory_symlink(version, dir.path() + "/..data_tmp");
    fs::rename(dir.path() + "/..data_tmp", dir.path() + "/..data");
  };
  publish("..v1", TokenLine("a", "tenant", kTokenA));
  fs::create_symlink("..data/tokens", dir.path() + "/tokens");
  ServerOptions options = testing::SmallServerOptions();
  options.auth.tokens_file = dir.path() + "/tokens";
  options.auth.reload_interval_seconds = 1;
  auto server = KvCacheServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto admin = pb::AdminService::NewStub(channel);
  auto works = [&](const std::string& token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + token);
    pb::ListPoolsResponse pools;
    return admin->ListPools(&ctx, {}, &pools).ok();
  };
  ASSERT_TRUE(works(kTokenA));
  ASSERT_FALSE(works(kTokenB));
  publish("..v2", TokenLine("b", "tenant", kTokenB));  // a's token revoked, b's issued
  bool swapped = false;
  for (int i = 0; i < 100 && !swapped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    swapped = works(kTokenB);
  }
  EXPECT_TRUE(swapped) << "the watcher did not follow the symlink swap";
  EXPECT_FALSE(works(kTokenA));
}

}  // namespace
}  // namespace kvc::cachesvc
