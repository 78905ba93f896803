// Transfer channels that can leave the node: under the gRPC listener's TLS (the same
// certificate, verified the same way) and with a MAC on every frame. A proxy between the
// reader and the server changes one byte of what the server sends: the frame is refused
// (DATA_LOSS) and nothing of it is served; the fetch reads over gRPC instead and its path says
// why. Tried in the clear and under TLS; the same proxy changing nothing passes every byte.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/security/certs.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::CertFile;
using ::testing::HasSubstr;
constexpr int kLayers = 4, kHeads = 2, kDim = 32, kTokens = 256;

// A TCP proxy on 127.0.0.2:`port` to 127.0.0.1:`port` (a server's transfer listener, which
// tells readers to connect to 127.0.0.2 through transfer_advertise_host). In the server's
// direction it passes bytes as they are; in the reader's it flips every bit of byte
// `flip_at` (counting the server's bytes from the first; -1: none).
class TamperProxy {
 public:
  TamperProxy(int port, int64_t flip_at) : port_(port), flip_at_(flip_at) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.2", &addr.sin_addr);
    ok_ = ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::listen(listen_fd_, 8) == 0;
    if (ok_) thread_ = std::thread([this] { Serve(); });
  }
  TamperProxy(const TamperProxy&) = delete;
  TamperProxy& operator=(const TamperProxy&) = delete;
  ~TamperProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listen_fd_);
  }
  bool ok() const { return ok_; }
  int64_t flipped() const { return flipped_.load(); }

 private:
  void Serve() {
    std::vector<std::thread> pumps;
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      const int reader = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (reader < 0) break;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(server, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(reader);
        ::close(server);
        continue;
      }
      pumps.emplace_back([=] { Pump(reader, server, -1); });
      pumps.emplace_back([=] { Pump(server, reader, flip_at_); });
    }
    for (std::thread& t : pumps) t.join();
  }
  // Copies `from` to `to` until either end closes, flipping byte `flip_at` on the way.
  void Pump(int from, int to, int64_t flip_at) {
    char buf[16384];
    int64_t at = 0;
    for (;;) {
      pollfd p{from, POLLIN, 0};
      if (stop_) break;
      if (::poll(&p, 1, 100) != 1) continue;
      const ssize_t n = ::recv(from, buf, sizeof(buf), 0);
      if (n <= 0) break;
      if (flip_at >= at && flip_at < at + n) {
        buf[flip_at - at] = static_cast<char>(~buf[flip_at - at]);
        flipped_.fetch_add(1);
      }
      at += n;
      if (::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    ::shutdown(to, SHUT_WR);
    ::shutdown(from, SHUT_RD);
  }

  const int port_;
  const int64_t flip_at_;
  int listen_fd_ = -1;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> flipped_{0};
  std::thread thread_;
};

cachesvc::ServerOptions Options(bool tls, const std::string& advertise_host = "") {
  cachesvc::ServerOptions o = ::kvc::testing::SmallServerOptions();
  o.store.pools[0].device = "cpu";
  o.transfer_listen = "127.0.0.1:0";
  o.transfer_advertise_host = advertise_host;
  if (tls) {
    o.tls.cert_file = CertFile("server.pem");
    o.tls.key_file = CertFile("server.key");
  }
  return o;
}

std::unique_ptr<client::KvCacheClient> Client(const cachesvc::KvCacheServer& server, bool tls,
                                              bool transfers) {
  client::ClientOptions o;
  o.target = server.address();
  o.local_reads = false;
  o.transfers = transfers;
  if (tls) {
    o.tls.ca_file = CertFile("ca.pem");
    o.tls.server_name = "localhost";  // the certificate names 127.0.0.1 and localhost
  }
  auto client = client::KvCacheClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

// A sequence of kTokens tokens on every layer (data seed 21).
std::string Filled(client::KvCacheClient& c) {
  auto seq = c.CreateSequence({});
  EXPECT_TRUE(seq.ok()) << seq.status();
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::string k = ::kvc::testing::MakeKv(21, layer, 0, kTokens, kHeads, kDim,
                                                 kernels::DType::kF16, /*is_value=*/false);
    const std::string v = ::kvc::testing::MakeKv(21, layer, 0, kTokens, kHeads, kDim,
                                                 kernels::DType::kF16, /*is_value=*/true);
    EXPECT_TRUE(c.Append({seq->sequence_id, layer, 0, kTokens, client::DType::kF16, k.data(),
                          v.data(), k.size()})
                    .ok());
  }
  return seq->sequence_id;
}

// Every head of `r` holds exactly the sequence's KV.
void ExpectTheSequencesKv(const client::FetchResult& r) {
  ASSERT_EQ(r.heads.size(), static_cast<size_t>(kLayers * kHeads));
  for (const client::FetchedHead& h : r.heads) {
    EXPECT_TRUE(h.keys == ::kvc::testing::MakeHeadKv(21, h.layer, h.kv_head, 0, kTokens, kDim,
                                                     kernels::DType::kF16, /*is_value=*/false))
        << "keys of layer " << h.layer << " head " << h.kv_head;
    EXPECT_TRUE(h.values == ::kvc::testing::MakeHeadKv(21, h.layer, h.kv_head, 0, kTokens, kDim,
                                                       kernels::DType::kF16, /*is_value=*/true))
        << "values of layer " << h.layer << " head " << h.kv_head;
  }
}

TEST(TransferSecurityTest, ATlsChannelCarriesFetchAndFetchIntoByteExact) {
  auto server = cachesvc::KvCacheServer::Start(Options(/*tls=*/true));
  ASSERT_TRUE(server.ok()) << server.status();
  auto via = Client(**server, /*tls=*/true, /*transfers=*/true);
  auto grpc_only = Client(**server, /*tls=*/true, /*transfers=*/false);
  const std::string id = Filled(*via);
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult got, via->Fetch(id, {}));
  ExpectTheSequencesKv(got);
  EXPECT_EQ(got.path,
            absl::StrCat("transfer (127.0.0.1:", (*server)->endpoints().transfer_port, ", TLS)"));
  std::vector<uint16_t> keys(kHeads * kTokens * kDim), values(keys.size());
  std::vector<uint16_t> want_keys(keys.size()), want_values(keys.size());
  client::FetchIntoOptions into;
  into.dtype = client::DType::kF16;
  into.num_kv_heads = kHeads;
  into.head_dim = kDim;
  for (int layer = 0; layer < kLayers; ++layer) {
    KVC_ASSERT_OK_AND_ASSIGN(
        const client::FetchIntoResult mine,
        via->FetchInto(id, {{layer, keys.data(), values.data(), kTokens}}, into));
    KVC_ASSERT_OK(
        grpc_only->FetchInto(id, {{layer, want_keys.data(), want_values.data(), kTokens}}, into)
            .status());
    EXPECT_EQ(keys, want_keys) << "layer " << layer;
    EXPECT_EQ(values, want_values) << "layer " << layer;
    EXPECT_THAT(mine.path, HasSubstr(", TLS)"));
  }
}

TEST(TransferSecurityTest, ATamperedFrameIsRefusedAndNothingOfItIsServed) {
  for (const bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "TLS" : "in the clear");
    auto server = cachesvc::KvCacheServer::Start(Options(tls, "127.0.0.2"));
    ASSERT_TRUE(server.ok()) << server.status();
    const int port = (*server)->endpoints().transfer_port;
    {
      // Unchanged, the proxy passes a whole fetch: what refuses below is the check.
      TamperProxy honest(port, -1);
      ASSERT_TRUE(honest.ok()) << "cannot listen on 127.0.0.2:" << port;
      auto c = Client(**server, tls, /*transfers=*/true);
      const std::string id = Filled(*c);
      KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult r, c->Fetch(id, {}));
      ExpectTheSequencesKv(r);
      EXPECT_EQ(r.path.rfind("transfer (127.0.0.2:", 0), 0u) << r.path;
    }
    // One byte of the payload (in the clear: past "OK\n" and the 32-byte header; under TLS:
    // well past the handshake, inside an application data record) arrives changed.
    TamperProxy tamper(port, tls ? 30000 : 3 + 32 + 100);
    ASSERT_TRUE(tamper.ok());
    auto c = Client(**server, tls, /*transfers=*/true);
    const std::string id = Filled(*c);
    KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult r, c->Fetch(id, {}));
    EXPECT_EQ(tamper.flipped(), 1);
    ExpectTheSequencesKv(r);  // over gRPC: nothing of the changed frame
    EXPECT_THAT(r.path, HasSubstr("grpc (the transfer channel broke: DATA_LOSS"));
    EXPECT_THAT(r.path, HasSubstr(tls ? "failed its integrity check" : "MAC does not match"));
  }
}

}  // namespace
}  // namespace kvc
