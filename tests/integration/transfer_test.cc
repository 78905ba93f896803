// Transfer channels (issue #13 item 4) through the real client and server: a client that
// cannot map the pool (here: local_reads off) receives each lease's blocks over a TCP channel
// and decodes them itself; Fetch and FetchInto then return exactly what gRPC returns (every
// dtype, stored records, layer subsets, unfinished layers, INT4 with a raw residual, a
// StreamingLLM-compacted lane), and every lease ends. The channel's refusals and failures are
// checked on the wire with raw stubs and sockets: a wrong token is refused, a send on an
// unconnected channel is FAILED_PRECONDITION, a reader that goes away mid-payload breaks the
// channel (UNAVAILABLE, then nothing more is sent on it) and pins nothing after its lease.
// Connections that never greet are bounded per peer (an IPv4 address, an IPv6 /64) and in all,
// and dropped after 2 s.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cachesvc/metrics/metrics.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/integration/read_paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"
#include "transfer/frame_mac.h"
#include "transfer/wire.h"

namespace kvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::ExpectSame;
using ::kvc::testing::Filled;
using ::kvc::testing::Int4WithResidual;

cachesvc::ServerOptions Options() {
  cachesvc::ServerOptions o = testing::SmallServerOptions();
  o.transfer_listen = "127.0.0.1:0";
  return o;
}

std::unique_ptr<client::KvCacheClient> Client(const std::string& target, bool transfers) {
  client::ClientOptions o;
  o.target = target;
  o.local_reads = false;  // as a reader on another node: the pool cannot be mapped
  o.transfers = transfers;
  return *client::KvCacheClient::Connect(o);
}

bool HasMetric(const cachesvc::KvCacheServer& s, const std::string& line) {
  return s.metrics()->Serialize().find(line + "\n") != std::string::npos;
}

// A TCP connection to the server's transfer port; -1 on failure.
int ConnectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A TCP connection to the server's transfer port from the loopback address `from` (any of
// 127.0.0.0/8 reaches the server from a peer address of its own); -1 on failure.
int ConnectFrom(const char* from, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &local.sin_addr);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The server's one-line answer on `fd` (without sending anything), "" if none came by `until`.
std::string ReplyBy(int fd, absl::Time until) {
  std::string reply;
  while (reply.empty() || reply.back() != '\n') {
    pollfd p{fd, POLLIN, 0};
    const int64_t ms = absl::ToInt64Milliseconds(until - absl::Now());
    char c = 0;
    if (ms < 0 || ::poll(&p, 1, static_cast<int>(ms)) != 1 || ::recv(fd, &c, 1, 0) != 1) break;
    reply.push_back(c);
  }
  return reply;
}

// Sends `line` and returns the server's one-line answer.
std::string Greet(int fd, const std::string& line) {
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return "send failed";
  }
  std::string reply;
  char c = 0;
  while (reply.size() < 256 && ::recv(fd, &c, 1, 0) == 1) {
    reply.push_back(c);
    if (c == '\n') break;
  }
  return reply;
}

class TransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = testing::StartTestServer(Options());
    auto channel = grpc::CreateChannel(t_.server->address(), grpc::InsecureChannelCredentials());
    kv_ = pb::KvCacheService::NewStub(channel);
  }
  grpc::Status OpenTransfer(pb::OpenTransferResponse* opened) {
    grpc::ClientContext ctx;
    return kv_->OpenTransfer(&ctx, pb::OpenTransferRequest(), opened);
  }
  grpc::Status SendLease(const std::string& transfer, const std::string& lease, uint64_t nonce,
                         pb::SendLeaseResponse* sent) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::SendLeaseRequest r;
    r.set_transfer_id(transfer);
    r.set_lease_id(lease);
    r.set_nonce(nonce);
    return kv_->SendLease(&ctx, r, sent);
  }

  testing::TestServer t_;
  std::unique_ptr<pb::KvCacheService::Stub> kv_;
};

TEST_F(TransferTest, FetchOverATransferEqualsFetchOverGrpc) {
  auto via = Client(t_.server->address(), /*transfers=*/true);
  auto grpc_only = Client(t_.server->address(), /*transfers=*/false);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string raw, Filled(*via, 100));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string q, Filled(*via, 90, Int4WithResidual()));
  KVC_ASSERT_OK_AND_ASSIGN(const std::string sink, Filled(*via, 120));
  KVC_ASSERT_OK(via->Compress(sink, client::CompressionSpec::StreamingLlm(4, 30)).status());
  KVC_ASSERT_OK_AND_ASSIGN(const std::string ahead, Filled(*via, 40, {}, /*layers=*/1));

  const std::vector<client::FetchOptions> cases = testing::FetchCases();
  int fetches = 0;
  for (const std::string& id : {raw, q, sink, ahead}) {
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << id << " case " << c);
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult mine, via->Fetch(id, cases[c]));
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult theirs, grpc_only->Fetch(id, cases[c]));
      ExpectSame(mine, theirs);
      EXPECT_EQ(mine.path.rfind("transfer (127.0.0.1:", 0), 0u) << mine.path;
      ++fetches;
    }
    for (const client::DType dtype : {client::DType::kF16, client::DType::kF32}) {
      for (const bool unfinished : {false, true}) {
        SCOPED_TRACE(::testing::Message() << id << " FetchInto unfinished " << unfinished);
        testing::ExpectFetchIntoMatchesFetch(*via, *grpc_only, id, dtype, unfinished);
        ++fetches;
      }
    }
  }
  const std::string port = std::to_string(t_.server->endpoints().transfer_port);
  EXPECT_EQ(via->DataPath(), "transfer (127.0.0.1:" + port + ")");
  EXPECT_EQ(via->AppendPath(), "grpc (no same-node path; transfer channels carry reads only)");
  EXPECT_EQ(grpc_only->DataPath(), "grpc (local_reads and transfers are off)");
  KVC_ASSERT_OK_AND_ASSIGN(const client::PoolStats stats,
                           kvc::client::AdminClient::Over(*via).GetPoolStats(""));
  EXPECT_EQ(stats.leases.granted, fetches) << "one lease per transfer Fetch";
  EXPECT_EQ(stats.leases.released, fetches) << "and each ended at once";
  EXPECT_EQ(stats.leases.active, 0);
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"opened\"} 1"));
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"connected\"} 1"));
  EXPECT_TRUE(
      HasMetric(*t_.server, "kvc_transfer_events_total{event=\"sent\"} " + std::to_string(fetches)))
      << t_.server->metrics()->Serialize();
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"failed\"} 0"));
  // Errors of the lease come back as they are; the channel stays in use.
  EXPECT_THAT(via->Fetch("s-nothing", {}).status(), testing::StatusIs(absl::StatusCode::kNotFound));
  KVC_ASSERT_OK(via->Fetch(raw, {}).status());
  EXPECT_EQ(via->DataPath(), "transfer (127.0.0.1:" + port + ")");
}

TEST_F(TransferTest, TheChannelRefusesStrangersAndUnconnectedSends) {
  pb::OpenTransferResponse opened;
  ASSERT_TRUE(OpenTransfer(&opened).ok());
  EXPECT_EQ(opened.port(), t_.server->endpoints().transfer_port);
  EXPECT_EQ(opened.token().size(), 32u);
  EXPECT_GT(opened.connect_within_ms(), 0);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Filled(*t_.client, 20));
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease, t_.client->LeaseSequence(id));
  pb::SendLeaseResponse sent;
  const grpc::Status early = SendLease(opened.transfer_id(), lease.lease_id, 1, &sent);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << early.error_message();
  EXPECT_NE(early.error_message().find("not connected"), std::string::npos);

  // A wrong token, a wrong id and garbage are refused and closed.
  for (const std::string& line : {transfer::Greeting(opened.transfer_id(), std::string(32, '0')),
                                  transfer::Greeting("t-0000000000000000", opened.token()),
                                  std::string("GET / HTTP/1.1\n")}) {
    const int fd = ConnectTo(opened.port());
    ASSERT_GE(fd, 0);
    EXPECT_EQ(Greet(fd, line).rfind("ERR ", 0), 0u) << line;
    ::close(fd);
  }
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"refused\"} 3"));
  const int fd = ConnectTo(opened.port());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Greet(fd, transfer::Greeting(opened.transfer_id(), opened.token())), "OK\n");
  // A second connection to the same channel is refused.
  const int again = ConnectTo(opened.port());
  EXPECT_EQ(Greet(again, transfer::Greeting(opened.transfer_id(), opened.token())).rfind("ERR ", 0),
            0u);
  ::close(again);

  // A lease that is not the caller's: a header with the code, and the channel stays usable.
  const grpc::Status unknown = SendLease(opened.transfer_id(), "l-0000000000000000", 7, &sent);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  char raw[transfer::kHeaderBytes];
  KVC_ASSERT_OK(transfer::ReadAll(fd, raw, sizeof(raw), absl::Now() + absl::Seconds(10)));
  transfer::FrameHeader header;
  ASSERT_TRUE(transfer::DecodeHeader(raw, &header));
  EXPECT_EQ(header.nonce, 7u);
  EXPECT_EQ(header.payload_bytes, 0u);
  EXPECT_EQ(header.code, static_cast<uint32_t>(absl::StatusCode::kNotFound));
  // Every frame ends with its MAC, keyed by the channel's frame key (a refusal's too).
  ASSERT_EQ(opened.frame_key().size(), transfer::kFrameKeyBytes);
  // Frames are numbered on the channel from 0: the MAC's nonce.
  uint64_t frame = 0;
  const auto expect_mac = [&](const std::string& head, const std::string& body) {
    transfer::Mac tag{};
    ASSERT_TRUE(
        transfer::ReadAll(fd, tag.data(), tag.size(), absl::Now() + absl::Seconds(10)).ok());
    transfer::FrameMac mac(opened.frame_key(), frame++);
    mac.Update(body.data(), body.size());
    EXPECT_TRUE(transfer::SameMac(tag, mac.Finish(head.data(), head.size()))) << "the frame's MAC";
  };
  expect_mac(std::string(raw, sizeof(raw)), "");

  std::string payload;
  std::thread reader([&] {
    if (!transfer::ReadAll(fd, raw, sizeof(raw), absl::Now() + absl::Seconds(30)).ok()) return;
    if (!transfer::DecodeHeader(raw, &header)) return;
    payload.resize(header.payload_bytes);
    (void)transfer::ReadAll(fd, payload.data(), payload.size(), absl::Now() + absl::Seconds(30));
  });
  const grpc::Status ok = SendLease(opened.transfer_id(), lease.lease_id, 8, &sent);
  reader.join();
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  expect_mac(std::string(raw, sizeof(raw)), payload);
  EXPECT_EQ(header.nonce, 8u);
  EXPECT_EQ(sent.bytes(), lease.leased_bytes);
  EXPECT_EQ(static_cast<int64_t>(payload.size()), lease.leased_bytes);
  EXPECT_EQ(sent.blocks(), 2 * 4 * 2) << "2 blocks per lane (20 tokens), 8 lanes, one format";
  ::close(fd);
  KVC_ASSERT_OK(t_.client->ReleaseLease(lease.lease_id).status());

  // Another caller's id is unknown to CloseTransfer once closed.
  grpc::ClientContext ctx;
  pb::CloseTransferRequest close;
  close.set_transfer_id(opened.transfer_id());
  pb::CloseTransferResponse closed;
  EXPECT_TRUE(kv_->CloseTransfer(&ctx, close, &closed).ok());
  grpc::ClientContext ctx2;
  EXPECT_EQ(kv_->CloseTransfer(&ctx2, close, &closed).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A reader that takes the header and goes away: the server's send fails, the channel is
// broken for good, and the lease's blocks go back when the lease ends.
TEST_F(TransferTest, AReaderThatGoesAwayBreaksTheChannelAndPinsNothing) {
  // About 16 MiB of blocks: more than the sockets buffer, so the server is still writing.
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Filled(*t_.client, 16000));
  pb::OpenTransferResponse opened;
  ASSERT_TRUE(OpenTransfer(&opened).ok());
  const int fd = ConnectTo(opened.port());
  ASSERT_GE(fd, 0);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_EQ(Greet(fd, transfer::Greeting(opened.transfer_id(), opened.token())), "OK\n");
  KVC_ASSERT_OK_AND_ASSIGN(const client::Lease lease,
                           t_.client->LeaseSequence(id, {}, absl::Seconds(2)));
  std::thread reader([&] {
    char raw[transfer::kHeaderBytes];
    (void)transfer::ReadAll(fd, raw, sizeof(raw), absl::Now() + absl::Seconds(30));
    ::close(fd);  // gone mid-payload
  });
  pb::SendLeaseResponse sent;
  const grpc::Status failed = SendLease(opened.transfer_id(), lease.lease_id, 1, &sent);
  reader.join();
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE) << failed.error_message();
  const grpc::Status after = SendLease(opened.transfer_id(), lease.lease_id, 2, &sent);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(after.error_message().find("broke"), std::string::npos) << after.error_message();
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"failed\"} 1"));
  // The lease was not released by anyone: its TTL ends it and the pool is as before it.
  KVC_ASSERT_OK(t_.client->Release(id).status());
  EXPECT_GT(kvc::client::AdminClient::Over(*t_.client).GetPoolStats("")->used_bytes, 0)
      << "the lease still pins the blocks";
  for (int i = 0;
       i < 100 && kvc::client::AdminClient::Over(*t_.client).GetPoolStats("")->used_bytes > 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(kvc::client::AdminClient::Over(*t_.client).GetPoolStats("")->used_bytes, 0);
  EXPECT_EQ(kvc::client::AdminClient::Over(*t_.client).GetPoolStats("")->leases.expired, 1);
}

// Connections to the transfer port that never greet (TcpChannelOptions: at most 8 ungreeted
// from one peer, 64 in all, each dropped after 2 s): eight peers holding 8 each fill every
// slot and one of them gets no ninth; another peer's FetchInto still gets its channel (the
// oldest idle connection makes room), and every idle one is dropped about 2 s after it came.
// The peers are distinct loopback addresses (127.0.0.2-9; the client is 127.0.0.1).
TEST_F(TransferTest, IdleConnectionsOfOtherPeersDoNotKeepAReaderOut) {
  auto via = Client(t_.server->address(), /*transfers=*/true);
  auto grpc_only = Client(t_.server->address(), /*transfers=*/false);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string id, Filled(*grpc_only, 50));
  const int port = t_.server->endpoints().transfer_port;
  constexpr int kPeers = 8, kPerPeer = 8;  // TcpChannelOptions' defaults: every slot taken
  std::vector<int> idle;
  for (int peer = 0; peer < kPeers; ++peer) {
    const std::string from = "127.0.0." + std::to_string(2 + peer);
    for (int i = 0; i < kPerPeer; ++i) {
      idle.push_back(ConnectFrom(from.c_str(), port));
      ASSERT_GE(idle.back(), 0) << from;
    }
  }
  const absl::Time connected = absl::Now();
  // A ninth from one peer is refused at once. Connections are accepted in order, so once its
  // answer came, all 64 before it hold their slots.
  const int ninth = ConnectFrom("127.0.0.2", port);
  ASSERT_GE(ninth, 0);
  EXPECT_EQ(ReplyBy(ninth, connected + absl::Seconds(1)),
            "ERR too many connections from 127.0.0.2 waiting to greet\n");
  ::close(ninth);

  testing::ExpectFetchIntoMatchesFetch(*via, *grpc_only, id, client::DType::kF16,
                                       /*unfinished=*/false);
  const std::string where = "transfer (127.0.0.1:" + std::to_string(port) + ")";
  EXPECT_EQ(via->DataPath(), where) << "the idle connections kept the reader's greeting out";
  EXPECT_LT(absl::Now() - connected, absl::Milliseconds(1500))
      << "too slow to tell: the idle connections may have timed out before the reader came";
  // The oldest idle connection made room for the reader's.
  EXPECT_EQ(ReplyBy(idle[0], connected + absl::Seconds(1)),
            "ERR dropped: too many connections waiting to greet\n");

  // The rest are dropped once they were idle for the greeting time (2 s).
  for (size_t i = 1; i < idle.size(); ++i) {
    EXPECT_EQ(ReplyBy(idle[i], connected + absl::Seconds(5)), "ERR no greeting in time\n") << i;
  }
  const absl::Duration dropped_after = absl::Now() - connected;
  EXPECT_GE(dropped_after, absl::Milliseconds(1900));
  EXPECT_LT(dropped_after, absl::Seconds(4));
  for (const int fd : idle) ::close(fd);
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"connected\"} 1"));
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"refused\"} 65"))
      << t_.server->metrics()->Serialize();
  // The reader's channel outlived them all.
  KVC_ASSERT_OK(via->Fetch(id, {}).status());
  EXPECT_EQ(via->DataPath(), where);
}

// Run in a child process (IPv6PeersAreCountedByTheirSlash64): a network namespace of its own
// whose loopback carries fd00:1::1, fd00:1::2 (one /64) and fd00:2::1 (another), a server
// with its transfer port on [::1], and the per-peer limit checked from those addresses.
// Returns the exit code: 0, or 1 after printing what went wrong.
int CheckIPv6PeerLimit() {
  const auto fail = [](const std::string& what) {
    std::fprintf(stderr, "%s\n", what.c_str());
    return 1;
  };
  if (::unshare(CLONE_NEWNET) != 0 && ::unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) {
    return fail(std::string("unshare(CLONE_NEWNET): ") + std::generic_category().message(errno));
  }
  const int ctl = ::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq up{};
  std::strcpy(up.ifr_name, "lo");
  up.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  if (::ioctl(ctl, SIOCSIFFLAGS, &up) != 0) return fail("cannot bring lo up");
  struct {  // linux/ipv6.h's in6_ifreq, which clashes with netinet/in.h
    in6_addr addr;
    uint32_t prefixlen;
    int ifindex;
  } add{};
  for (const char* a : {"fd00:1::1", "fd00:1::2", "fd00:2::1"}) {
    ::inet_pton(AF_INET6, a, &add.addr);
    add.prefixlen = 64;
    add.ifindex = static_cast<int>(::if_nametoindex("lo"));
    if (::ioctl(ctl, SIOCSIFADDR, &add) != 0) {
      return fail(std::string("cannot add ") + a + ": " + std::generic_category().message(errno));
    }
  }
  ::close(ctl);
  cachesvc::ServerOptions o = testing::SmallServerOptions();
  o.transfer_listen = "[::1]:0";
  testing::TestServer t = testing::StartTestServer(o);
  const int port = t.server->endpoints().transfer_port;
  const auto connect_from = [port](const char* from) {
    const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 local{};
    local.sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, from, &local.sin6_addr);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    addr.sin6_addr = in6addr_loopback;
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0 ||
        ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {  // max_ungreeted_per_peer
    idle.push_back(connect_from("fd00:1::1"));
    if (idle.back() < 0)
      return fail(std::string("connect from fd00:1::1: ") + std::generic_category().message(errno));
  }
  const absl::Time connected = absl::Now();
  // Another address of the same /64: the same peer, no ninth slot.
  const int same = connect_from("fd00:1::2");
  const std::string refused = ReplyBy(same, connected + absl::Seconds(1));
  if (refused != "ERR too many connections from fd00:1::/64 waiting to greet\n") {
    return fail("fd00:1::2 (the /64 of eight idle connections) was answered '" + refused + "'");
  }
  // Another /64: a peer of its own, whose connection waits for its greeting.
  const int other = connect_from("fd00:2::1");
  const std::string waits = ReplyBy(other, absl::Now() + absl::Milliseconds(300));
  if (other < 0 || !waits.empty()) {
    return fail("fd00:2::1 (another /64) was refused: '" + waits + "'");
  }
  for (const int fd : idle) ::close(fd);
  ::close(same);
  ::close(other);
  return 0;
}

// IPv6 peers of the transfer port are counted by their /64 (a host is commonly given a whole
// /64, so counting single addresses would not limit it). Loopback has only ::1, so the check
// runs in a child process with a network namespace of its own (CheckIPv6PeerLimit).
TEST(TransferPeerTest, IPv6PeersAreCountedByTheirSlash64) {
  const pid_t child = ::fork();  // before this process starts any thread (one test per process)
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(CheckIPv6PeerLimit());
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the check died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's message above";
}

// A server restart breaks the client's channel: the client notices the hang-up before its
// next Fetch and opens a channel to the new server.
TEST_F(TransferTest, AClientReopensItsChannelAfterARestart) {
  auto via = Client(t_.server->address(), /*transfers=*/true);
  KVC_ASSERT_OK_AND_ASSIGN(const std::string before, Filled(*via, 50));
  KVC_ASSERT_OK(via->Fetch(before, {}).status());
  const std::string first_port = std::to_string(t_.server->endpoints().transfer_port);
  EXPECT_EQ(via->DataPath(), "transfer (127.0.0.1:" + first_port + ")");
  const std::string address = t_.server->address();
  t_ = {};
  cachesvc::ServerOptions o = Options();
  o.listen = address;  // the same gRPC address: the client's channel reconnects to it
  t_ = testing::StartTestServer(o);
  KVC_ASSERT_OK(kvc::client::AdminClient::Over(*via)
                    .GetServerInfo()
                    .status());  // retried until the channel is back
  KVC_ASSERT_OK_AND_ASSIGN(const std::string after, Filled(*via, 30));
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult got, via->Fetch(after, {}));
  EXPECT_EQ(got.visible_tokens, 30);
  const std::string second_port = std::to_string(t_.server->endpoints().transfer_port);
  EXPECT_EQ(via->DataPath(), "transfer (127.0.0.1:" + second_port + ")");
  EXPECT_TRUE(HasMetric(*t_.server, "kvc_transfer_events_total{event=\"connected\"} 1"));
}

// Beside TLS, NCCL (which does not encrypt) needs the config to say the fabric is trusted;
// TCP channels run under TLS themselves (tests/security/transfer_security_test.cc).
TEST(TransferConfigTest, ServersWithTlsOfferNcclOnlyOnATrustedFabric) {
  cachesvc::ServerOptions o = Options();
  o.tls.cert_file = "/nonexistent/cert.pem";
  o.tls.key_file = "/nonexistent/key.pem";
  o.transfer_listen.clear();
  o.transfer_nccl_library = "libnccl.so.2";
  // Refused for the combination, before any file is read.
  EXPECT_THAT(cachesvc::KvCacheServer::Start(o).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                "transfer_nccl_library carries KV in the clear"));
  o.transfer_nccl_trusted_fabric = true;
  // Past that check: the next refusal is the certificate file's.
  EXPECT_THAT(cachesvc::KvCacheServer::Start(o).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "cannot read tls.cert_file"));
}

// A server asked for NCCL transfers that cannot load the library does not start, and says
// which library and why; with the machine's NCCL it starts and says which NCCL serves them.
TEST(TransferConfigTest, AnNcclLibraryThatCannotBeLoadedFailsStartup) {
  cachesvc::ServerOptions o = Options();
  o.transfer_nccl_library = "libkvc-no-such-nccl.so";
  EXPECT_THAT(cachesvc::KvCacheServer::Start(o).status(),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                "transfer_nccl_library: NCCL could not be loaded from "
                                "libkvc-no-such-nccl.so: "));
  o.transfer_nccl_library = "libnccl.so.2";
  testing::TestServer t = testing::StartTestServer(o);
  EXPECT_EQ(t.server->endpoints().nccl_transfers.rfind("NCCL 2.", 0), 0u)
      << t.server->endpoints().nccl_transfers;
}

}  // namespace
}  // namespace kvc
