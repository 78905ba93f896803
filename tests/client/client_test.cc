// Client behaviour a caller relies on: option validation, deadlines, and retries only for
// idempotent calls on UNAVAILABLE.
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

// A port nobody listens on: bind one, remember it, shut the server down.
int UnusedPort() {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions(1 << 20));
  return t.server->port();
}

TEST(ClientTest, ConnectValidatesOptions) {
  client::ClientOptions o;
  o.target = "";
  EXPECT_THAT(client::KvCacheClient::Connect(o), StatusIs(Code::kInvalidArgument, "target"));
  o.target = "127.0.0.1:1";
  o.max_attempts = 0;
  EXPECT_THAT(client::KvCacheClient::Connect(o), StatusIs(Code::kInvalidArgument, "max_attempts"));
}

TEST(ClientTest, ReadsAreRetriedOnUnavailableButWritesAreNot) {
  client::ClientOptions o;
  o.target = absl::StrCat("127.0.0.1:", UnusedPort());
  o.max_attempts = 3;
  o.initial_backoff = absl::Milliseconds(300);
  KVC_ASSERT_OK_AND_ASSIGN(auto c, client::KvCacheClient::Connect(o));

  absl::Time start = absl::Now();
  EXPECT_THAT(c->GetSequence("s"), StatusIs(Code::kUnavailable));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(900));  // 300 + 600 ms of backoff

  start = absl::Now();
  client::AppendChunk chunk;
  chunk.sequence_id = "s";
  chunk.num_tokens = 1;
  EXPECT_THAT(c->Append(chunk), StatusIs(Code::kUnavailable));
  EXPECT_THAT(c->CreateSequence({}), StatusIs(Code::kUnavailable));
  EXPECT_THAT(c->Release("s"), StatusIs(Code::kUnavailable));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
}

TEST(ClientTest, RetryReachesAServerThatComesUp) {
  const int port = UnusedPort();
  client::ClientOptions o;
  o.target = absl::StrCat("127.0.0.1:", port);
  o.max_attempts = 30;
  o.initial_backoff = absl::Milliseconds(50);
  o.max_backoff = absl::Milliseconds(100);
  KVC_ASSERT_OK_AND_ASSIGN(auto c, client::KvCacheClient::Connect(o));
  std::unique_ptr<cachesvc::KvCacheServer> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto options = ::kvc::testing::SmallServerOptions(1 << 20);
    options.listen = absl::StrCat("127.0.0.1:", port);
    auto s = cachesvc::KvCacheServer::Start(options);
    if (s.ok()) server = std::move(*s);
  });
  // NOT_FOUND comes from the server: the retried call got through.
  EXPECT_THAT(c->GetSequence("missing"), StatusIs(Code::kNotFound));
  starter.join();
}

TEST(ClientTest, DeadlinesApplyPerCall) {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions(1 << 20));
  client::CallOptions tiny;
  tiny.deadline = absl::Nanoseconds(1);
  EXPECT_THAT(t.client->ListPools(tiny), StatusIs(Code::kDeadlineExceeded));
  KVC_EXPECT_OK(t.client->ListPools());
}

TEST(ClientTest, ServerRejectsStartWhenTheAddressIsTaken) {
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions(1 << 20));
  auto options = ::kvc::testing::SmallServerOptions(1 << 20);
  options.listen = t.server->address();
  EXPECT_THAT(cachesvc::KvCacheServer::Start(options),
              StatusIs(Code::kUnavailable, "cannot listen"));
}

}  // namespace
}  // namespace kvc
