// Client behaviour a caller relies on: option validation, deadlines, and retries only for
// idempotent calls on UNAVAILABLE.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
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

// A listener that completes TCP handshakes but never answers: a call to it can only end by
// its deadline. (A 1 ns deadline against a real server raced gRPC's deadline timer, which
// under TSan fired after a fast ListPools had already returned OK.)
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(ClientTest, DeadlinesApplyPerCall) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  client::ClientOptions o;
  o.target = absl::StrCat("127.0.0.1:", silent.port());
  o.default_deadline = absl::Seconds(120);
  auto c = client::KvCacheClient::Connect(o);
  KVC_ASSERT_OK(c);
  client::CallOptions short_call;
  short_call.deadline = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  EXPECT_THAT(kvc::client::AdminClient::Over(**c).ListPools(short_call),
              StatusIs(Code::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the call waited for the 120 s default";

  // Against a real server the default deadline lets the same call through.
  auto t = ::kvc::testing::StartTestServer(::kvc::testing::SmallServerOptions(1 << 20));
  KVC_EXPECT_OK(kvc::client::AdminClient::Over(*t.client).ListPools());
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
