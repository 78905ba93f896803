// Same-node reads through the real client and server: with the server's local_socket the
// client maps the host pool and Fetch returns exactly what the gRPC path returns (dense in
// each dtype, stored records, a layer subset, an unfinished layer, INT4 with a raw residual),
// ending every lease it took; without the socket, with this uid refused, or with another
// server at the path, it falls back to gRPC and says why.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <filesystem>
#include <string>

#include "cachesvc/metrics/metrics.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "tests/integration/read_paths.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::ExpectSame;
using ::kvc::testing::Filled;
using ::kvc::testing::Int4WithResidual;
using ::kvc::testing::kDim;
using ::kvc::testing::kHeads;
using ::kvc::testing::kLayers;

// What a process running as `uid` reads from the socket at `path` (its greeting or refusal),
// or "connect: errno <n>". Forks: the child only makes system calls and exits.
std::string GreetingAs(uid_t uid, const std::string& path) {
  int out[2];
  if (::pipe(out) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    char buf[256];
    size_t n = 0;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    // Only async-signal-safe calls after fork (the parent has threads): errno as a number.
    const auto fail = [&](const char* what) {
      n = std::strlen(what);
      std::memcpy(buf, what, n);
      n = static_cast<size_t>(std::to_chars(buf + n, buf + sizeof(buf), errno).ptr - buf);
    };
    if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) {
      fail("setresuid: errno ");
    } else if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      fail("connect: errno ");
    } else {
      const ssize_t got = ::read(fd, buf, sizeof(buf));
      n = got > 0 ? static_cast<size_t>(got) : 0;
    }
    (void)!::write(out[1], buf, n);
    ::_exit(0);
  }
  ::close(out[1]);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;)
    got.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  ::waitpid(pid, nullptr, 0);
  return got;
}

class LocalReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvc-local-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  cachesvc::ServerOptions Options(std::vector<uint32_t> uids = {}) {
    cachesvc::ServerOptions o = testing::SmallServerOptions();
    o.store.pools[0].device = "cpu";  // a host pool: the one kind a local reader maps
    o.local_socket = dir_ + "/kvcached.sock";
    // The test is the engine, as kvcached's uid, unless it names other uids.
    o.local_socket_allow_same_uid = uids.empty();
    o.local_socket_uids = std::move(uids);
    return o;
  }
  static std::unique_ptr<client::KvCacheClient> Client(const std::string& target, bool local) {
    client::ClientOptions o;
    o.target = target;
    o.local_reads = local;
    return *client::KvCacheClient::Connect(o);
  }
  std::string dir_;
};

TEST_F(LocalReadTest, FetchFromTheMappedPoolEqualsFetchOverGrpc) {
  testing::TestServer t = testing::StartTestServer(Options());
  auto local = Client(t.server->address(), /*local=*/true);
  auto remote = Client(t.server->address(), /*local=*/false);
  EXPECT_EQ(local->DataPath(), "grpc (no Fetch yet)");
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*local, 100));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string q, Filled(*local, 90, Int4WithResidual()));
  // One layer ahead of the others: visible vs unfinished tokens.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string ahead, Filled(*local, 40, {}, /*layers=*/1));

  const std::vector<client::FetchOptions> cases = testing::FetchCases();
  for (const std::string& id : {raw, q, ahead}) {
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << id << " case " << c);
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult mine, local->Fetch(id, cases[c]));
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult theirs, remote->Fetch(id, cases[c]));
      ExpectSame(mine, theirs);
      // Each result says the path it took.
      EXPECT_EQ(mine.path, "shared-memory (" + dir_ + "/kvcached.sock)");
      EXPECT_EQ(theirs.path, "grpc (local_reads is off)");
    }
  }
  EXPECT_EQ(local->DataPath(), "shared-memory (" + dir_ + "/kvcached.sock)");
  EXPECT_EQ(remote->DataPath(), "grpc (local_reads is off)");
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*local).GetPoolStats(""));
  EXPECT_EQ(stats.leases.granted, 18) << "one lease per local Fetch";
  EXPECT_EQ(stats.leases.released, 18) << "and each ended at once";
  EXPECT_EQ(stats.leases.active, 0);
  // One reader connected, and mapped two arenas (f16; INT4 for the compressed sequence).
  const std::string metrics = t.server->metrics()->Serialize();
  EXPECT_NE(metrics.find("kvc_local_socket_events_total{event=\"connected\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("kvc_local_socket_events_total{event=\"arena\"} 2\n"), std::string::npos);
  EXPECT_NE(metrics.find("kvc_local_socket_events_total{event=\"refused\"} 0\n"),
            std::string::npos);
  // A missing sequence is the same error either way.
  EXPECT_THAT(local->Fetch("s-nothing", {}).status(),
              testing::StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(LocalReadTest, FallsBackToGrpcAndSaysWhy) {
  {
    cachesvc::ServerOptions o = Options();
    o.local_socket.clear();
    testing::TestServer t = testing::StartTestServer(o);
    auto c = Client(t.server->address(), /*local=*/true);
    KVC_ASSERT_OK_AND_ASSIGN(const std::string s, Filled(*c, 20));
    KVC_ASSERT_OK(c->Fetch(s, {}).status());
    EXPECT_EQ(c->DataPath(), "grpc (the server has no local_socket)");
  }
  {
    // This uid (kvcached's) is not admitted: the socket refuses, the client reads over gRPC.
    testing::TestServer t = testing::StartTestServer(Options({::geteuid() + 1}));
    auto c = Client(t.server->address(), /*local=*/true);
    KVC_ASSERT_OK_AND_ASSIGN(const std::string s, Filled(*c, 20));
    KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult r, c->Fetch(s, {}));
    EXPECT_EQ(r.heads.size(), static_cast<size_t>(kLayers * kHeads));
    EXPECT_NE(c->DataPath().find("is kvcached's own uid, which may not connect"), std::string::npos)
        << c->DataPath();
    EXPECT_NE(t.server->metrics()->Serialize().find(
                  "kvc_local_socket_events_total{event=\"refused\"} 1\n"),
              std::string::npos);
  }
  {
    // A second server refuses a path a live server listens on.
    testing::TestServer first = testing::StartTestServer(Options());
    EXPECT_THAT(cachesvc::KvCacheServer::Start(Options()),
                testing::StatusIs(absl::StatusCode::kFailedPrecondition, "is in use"));
  }
  {
    // Another server's socket at the path (moved there behind the first one's back): its
    // greeting carries another token.
    testing::TestServer first = testing::StartTestServer(Options());
    cachesvc::ServerOptions other = Options();
    other.local_socket = dir_ + "/other.sock";
    testing::TestServer second = testing::StartTestServer(other);
    ASSERT_EQ(::rename(other.local_socket.c_str(), (dir_ + "/kvcached.sock").c_str()), 0);
    auto c = Client(first.server->address(), /*local=*/true);
    KVC_ASSERT_OK_AND_ASSIGN(const std::string s, Filled(*c, 20));
    KVC_ASSERT_OK(c->Fetch(s, {}).status());
    EXPECT_NE(c->DataPath().find("another server's"), std::string::npos) << c->DataPath();
  }
}

// FetchInto writes the rows Fetch returns, in place, on both paths: raw, INT4 with a raw
// residual (decoded), StreamingLLM-compacted (two position runs), a layer ahead; rows past a
// lane's tokens stay as they were.
TEST_F(LocalReadTest, FetchIntoWritesWhatFetchReturnsOnBothPaths) {
  testing::TestServer t = testing::StartTestServer(Options());
  auto local = Client(t.server->address(), /*local=*/true);
  auto remote = Client(t.server->address(), /*local=*/false);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*local, 100));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string q, Filled(*local, 90, Int4WithResidual()));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string sink, Filled(*local, 120));
  KVC_ASSERT_OK(local->Compress(sink, client::CompressionSpec::StreamingLlm(4, 30)).status());
  KVC_ASSERT_OK_AND_ASSIGN(const std::string ahead, Filled(*local, 40, {}, /*layers=*/1));

  for (const client::DType dtype : {client::DType::kF16, client::DType::kF32}) {
    for (const std::string& id : {raw, q, sink, ahead}) {
      for (const bool unfinished : {false, true}) {
        for (client::KvCacheClient* c : {local.get(), remote.get()}) {
          SCOPED_TRACE(::testing::Message()
                       << id << " f32 " << (dtype == client::DType::kF32) << " unfinished "
                       << unfinished << " via " << c->DataPath());
          testing::ExpectFetchIntoMatchesFetch(*c, *remote, id, dtype, unfinished);
        }
      }
    }
  }
  EXPECT_EQ(local->DataPath(), "shared-memory (" + dir_ + "/kvcached.sock)");
}

TEST_F(LocalReadTest, FetchIntoRefusesBuffersThatDoNotFit) {
  testing::TestServer t = testing::StartTestServer(Options());
  auto local = Client(t.server->address(), /*local=*/true);
  auto remote = Client(t.server->address(), /*local=*/false);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string s, Filled(*local, 50));
  std::string keys(kHeads * 64 * kDim * 2, '\0'), values = keys;
  client::FetchIntoOptions into;
  into.dtype = client::DType::kF16;
  into.num_kv_heads = kHeads;
  into.head_dim = kDim;
  for (client::KvCacheClient* c : {local.get(), remote.get()}) {
    SCOPED_TRACE(c == local.get() ? "same-node" : "grpc");
    // 50 tokens, room for 40 rows per head.
    const std::string untouched(keys.size(), '\0');
    absl::Status small = c->FetchInto(s, {{1, keys.data(), values.data(), 40}}, into).status();
    EXPECT_THAT(small, testing::StatusIs(absl::StatusCode::kOutOfRange));
    EXPECT_NE(small.message().find("holds"), std::string::npos) << small;
    if (c == local.get()) {
      EXPECT_EQ(keys, untouched) << "checked before anything is written";
    }
    client::FetchIntoOptions heads = into;
    heads.num_kv_heads = kHeads + 1;
    EXPECT_THAT(c->FetchInto(s, {{1, keys.data(), values.data(), 64}}, heads),
                testing::StatusIs(absl::StatusCode::kInvalidArgument));
    client::FetchIntoOptions dim = into;
    dim.head_dim = kDim / 2;
    EXPECT_THAT(c->FetchInto(s, {{1, keys.data(), values.data(), 64}}, dim),
                testing::StatusIs(absl::StatusCode::kInvalidArgument));
    client::FetchIntoOptions pool_default = into;
    pool_default.dtype = client::DType::kPoolDefault;
    EXPECT_THAT(c->FetchInto(s, {{1, keys.data(), values.data(), 64}}, pool_default),
                testing::StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(
        c->FetchInto(s, {{1, keys.data(), values.data(), 64}, {1, keys.data(), values.data(), 64}},
                     into),
        testing::StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(c->FetchInto("s-nothing", {{1, keys.data(), values.data(), 64}}, into),
                testing::StatusIs(absl::StatusCode::kNotFound));
  }
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*local).GetPoolStats(""));
  EXPECT_EQ(stats.leases.active, 0) << "a refused read ends its lease";
}

}  // namespace
// local_socket_uids names the engines' uids, which are not kvcached's: connect(2) needs write
// permission on the socket file, so the file is open to every uid and the server decides by
// the peer's credentials. Needs root to act as another uid (CI runs as root).
TEST_F(LocalReadTest, AnotherUidReachesTheSocketAndTheServerDecidesByItsUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  constexpr uid_t kNobody = 65534;
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);  // the directory must be searchable (operators)
  {
    testing::TestServer t = testing::StartTestServer(Options({kNobody}));
    struct stat st {};
    ASSERT_EQ(::stat((dir_ + "/kvcached.sock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    EXPECT_EQ(GreetingAs(kNobody, dir_ + "/kvcached.sock").rfind("KVC-LOCAL 2 ", 0), 0u);
  }
  {
    testing::TestServer t = testing::StartTestServer(Options());  // kvcached's own uid only
    EXPECT_EQ(GreetingAs(kNobody, dir_ + "/kvcached.sock"),
              "ERR uid 65534 may not map this server's pools (local_socket_uids)\n");
  }
}

}  // namespace kvc
