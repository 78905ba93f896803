// Appends through a staging region (same node): the real client and server with a local
// socket. The client copies keys and values into the region the server made for it and sends
// offsets; what the pool then holds equals what a gRPC Append of the same bytes stores, raw and
// quantized, one call or a stream, from several threads, with a region too small for some
// chunks (those go over gRPC). Over the raw protocol: the region is sealed against resizing
// (the server's reads can never fault), and every malformed staged request gets its own status.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

namespace pb = ::kvcache::v1;
using ::kvc::testing::MakeKv;
constexpr int kLayers = 4, kHeads = 2, kDim = 32;

struct Kv {
  std::string keys, values;
};
Kv Data(int seed, int layer, int start, int n) {
  return {MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/false),
          MakeKv(seed, layer, start, n, kHeads, kDim, kernels::DType::kF16, /*is_value=*/true)};
}

client::AppendChunk Chunk(const std::string& id, int layer, int start, const Kv& kv) {
  client::AppendChunk a;
  a.sequence_id = id;
  a.layer = layer;
  a.start_position = start;
  a.num_tokens = static_cast<int>(kv.keys.size() / (kHeads * kDim * 2));
  a.dtype = client::DType::kF16;
  a.keys = kv.keys.data();
  a.values = kv.values.data();
  a.bytes = kv.keys.size();
  return a;
}

// `n` tokens per layer in chunks of `step`, through Append or an AppendStream.
absl::Status Store(client::KvCacheClient& c, const std::string& id, int seed, int n, int step,
                   bool stream) {
  std::unique_ptr<client::AppendStream> s = stream ? c.StartAppendStream() : nullptr;
  for (int at = 0; at < n; at += step) {
    for (int l = 0; l < kLayers; ++l) {
      const Kv kv = Data(seed, l, at, std::min(step, n - at));
      const client::AppendChunk chunk = Chunk(id, l, at, kv);
      const absl::Status st = s ? s->Write(chunk) : c.Append(chunk).status();
      if (!st.ok()) return s ? s->Finish().status() : st;
    }
  }
  if (s) return s->Finish().status();
  return absl::OkStatus();
}

void ExpectSameKv(client::KvCacheClient& reader, const std::string& a, const std::string& b) {
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult x, reader.Fetch(a, {}));
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult y, reader.Fetch(b, {}));
  EXPECT_EQ(x.visible_tokens, y.visible_tokens);
  ASSERT_EQ(x.heads.size(), y.heads.size());
  for (size_t i = 0; i < x.heads.size(); ++i) {
    EXPECT_TRUE(x.heads[i].keys == y.heads[i].keys) << "keys of head " << i;
    EXPECT_TRUE(x.heads[i].values == y.heads[i].values) << "values of head " << i;
  }
}

class StagedAppendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvc-staged-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  cachesvc::ServerOptions Options() {
    cachesvc::ServerOptions o = testing::SmallServerOptions();
    o.store.pools[0].device = "cpu";
    o.local_socket = dir_ + "/kvcached.sock";
    o.local_socket_allow_same_uid = true;  // the test is the engine, as this uid
    return o;
  }
  static std::unique_ptr<client::KvCacheClient> Client(const std::string& target, bool local,
                                                       int64_t staging_bytes = 64 << 20) {
    client::ClientOptions o;
    o.target = target;
    o.local_reads = local;
    o.staging_bytes = staging_bytes;
    return *client::KvCacheClient::Connect(o);
  }
  std::string dir_;
};

TEST_F(StagedAppendTest, StagedAppendsStoreWhatGrpcAppendsStore) {
  testing::TestServer t = testing::StartTestServer(Options());
  auto local = Client(t.server->address(), /*local=*/true);
  auto remote = Client(t.server->address(), /*local=*/false);
  EXPECT_EQ(local->AppendPath(), "grpc (no Append yet)");
  client::CreateSequenceOptions int4;
  int4.policy = client::CompressionSpec{}.WithStorage(client::StorageFormat::kInt4G32);
  int4.policy.residual_tokens = 16;
  for (const bool stream : {false, true}) {
    for (const client::CreateSequenceOptions& options : {client::CreateSequenceOptions{}, int4}) {
      SCOPED_TRACE(::testing::Message()
                   << "stream " << stream << " int4 " << static_cast<int>(options.policy.storage));
      KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo a, local->CreateSequence(options));
      KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo b, remote->CreateSequence(options));
      KVC_ASSERT_OK(Store(*local, a.sequence_id, 7, 150, 40, stream));
      KVC_ASSERT_OK(Store(*remote, b.sequence_id, 7, 150, 40, stream));
      ExpectSameKv(*remote, a.sequence_id, b.sequence_id);
    }
  }
  EXPECT_EQ(local->AppendPath(), "staged (67108864-byte region)");
  EXPECT_EQ(remote->AppendPath(), "grpc (local_reads is off)");

  // A rejected chunk in a staged stream: Finish names it, the earlier ones stay applied.
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo s, local->CreateSequence({}));
  auto stream = local->StartAppendStream();
  const Kv kv = Data(1, 0, 0, 8);
  KVC_ASSERT_OK(stream->Write(Chunk(s.sequence_id, 0, 0, kv)));
  (void)stream->Write(Chunk(s.sequence_id, 0, 100, kv));  // a gap: refused by the server
  const absl::Status finished = stream->Finish().status();
  EXPECT_EQ(finished.code(), absl::StatusCode::kFailedPrecondition) << finished;
  EXPECT_NE(finished.message().find("message 1 (layer 0, start_position 100) rejected"),
            std::string::npos)
      << finished;
  EXPECT_NE(finished.message().find("1 messages were applied"), std::string::npos) << finished;
  EXPECT_FALSE(stream->Write(Chunk(s.sequence_id, 0, 8, kv)).ok()) << "after Finish";
}

TEST_F(StagedAppendTest, ConcurrentAppendsShareOneSmallRegion) {
  testing::TestServer t = testing::StartTestServer(Options());
  // 8 KiB: one 40-token chunk (2 x 5 KiB) never fits, a 16-token one (2 x 2 KiB) does while
  // at most one other is in flight: both paths run, in the same sequence.
  auto local = Client(t.server->address(), /*local=*/true, 8 << 10);
  auto remote = Client(t.server->address(), /*local=*/false);
  std::vector<std::string> mine(4), theirs(4);
  for (int i = 0; i < 4; ++i) {
    mine[i] = local->CreateSequence({})->sequence_id;
    theirs[i] = remote->CreateSequence({})->sequence_id;
  }
  std::vector<std::thread> threads;
  threads.reserve(4);
  std::vector<absl::Status> status(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      status[i] = Store(*local, mine[i], 10 + i, 96, i % 2 == 0 ? 16 : 40, /*stream=*/i >= 2);
    });
  }
  for (std::thread& th : threads) th.join();
  for (int i = 0; i < 4; ++i) {
    KVC_EXPECT_OK(status[i]);
    KVC_ASSERT_OK(Store(*remote, theirs[i], 10 + i, 96, i % 2 == 0 ? 16 : 40, false));
    ExpectSameKv(*remote, mine[i], theirs[i]);
  }
  EXPECT_EQ(local->AppendPath(), "staged (8192-byte region)");
}

// The writer's side of the socket protocol, by hand.
struct RawRegion {
  std::string id;
  int fd = -1;
};
class RawSocket {
 public:
  explicit RawSocket(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    EXPECT_EQ(::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    int unused = -1;
    EXPECT_EQ(Line(&unused).rfind("KVC-LOCAL 2 ", 0), 0u);
    const std::string auth = "AUTH -\n";  // the test server has no authentication
    EXPECT_EQ(::send(fd_, auth.data(), auth.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(auth.size()));
    EXPECT_EQ(Line(&unused), "OK");
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  ~RawSocket() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // "OK <id> <bytes>" with the fd, or the error line.
  std::string Stage(const std::string& bytes, RawRegion* region) {
    const std::string request = "STAGE " + bytes + "\n";
    EXPECT_EQ(::send(fd_, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string line = Line(&region->fd);
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() == 3 && words[0] == "OK") region->id = words[1];
    return line;
  }

 private:
  std::string Line(int* passed_fd) {
    std::string line;
    char c = 0;
    while (c != '\n') {
      msghdr msg{};
      iovec iov{&c, 1};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      if (::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC) != 1) return line + "<closed>";
      if (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr && h->cmsg_type == SCM_RIGHTS) {
        std::memcpy(passed_fd, CMSG_DATA(h), sizeof(int));
      }
      if (c != '\n') line.push_back(c);
    }
    return line;
  }
  int fd_ = -1;
};

TEST_F(StagedAppendTest, RawProtocolRefusesEveryMalformedStagedAppend) {
  testing::TestServer t = testing::StartTestServer(Options());
  auto kv = pb::KvCacheService::NewStub(
      grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials()));
  RawSocket socket(Options().local_socket);
  RawRegion region;
  ASSERT_EQ(socket.Stage("65536", &region).rfind("OK ", 0), 0u);
  ASSERT_GE(region.fd, 0);
  // Sealed: the writer cannot shrink the file under the server's mapping.
  EXPECT_NE(::ftruncate(region.fd, 4096), 0);
  auto* p = static_cast<uint8_t*>(
      ::mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, region.fd, 0));
  ASSERT_NE(p, MAP_FAILED);
  const Kv data = Data(3, 0, 0, 10);  // 1280 bytes each
  std::memcpy(p + 1024, data.keys.data(), data.keys.size());
  std::memcpy(p + 8192, data.values.data(), data.values.size());

  const std::string id = t.client->CreateSequence({})->sequence_id;
  auto append = [&](const std::function<void(pb::AppendRequest&)>& change) {
    pb::AppendRequest r;
    r.set_sequence_id(id);
    r.set_layer(0);
    r.set_num_tokens(10);
    r.mutable_staged()->set_region_id(region.id);
    r.mutable_staged()->set_keys_offset(1024);
    r.mutable_staged()->set_values_offset(8192);
    r.mutable_staged()->set_bytes(static_cast<int64_t>(data.keys.size()));
    change(r);
    grpc::ClientContext context;
    pb::AppendResponse response;
    return kv->Append(&context, r, &response).error_code();
  };
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.set_keys("x"); }), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.mutable_staged()->set_region_id("nope"); }),
            grpc::FAILED_PRECONDITION);
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.mutable_staged()->set_keys_offset(65000); }),
            grpc::OUT_OF_RANGE);
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.mutable_staged()->set_values_offset(-1); }),
            grpc::OUT_OF_RANGE);
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.mutable_staged()->set_bytes(INT64_MAX); }),
            grpc::OUT_OF_RANGE);
  EXPECT_EQ(append([](pb::AppendRequest& r) { r.mutable_staged()->set_bytes(1000); }),
            grpc::INVALID_ARGUMENT);  // not 10 tokens' worth
  KVC_ASSERT_OK_AND_ASSIGN(const client::SequenceInfo untouched, t.client->GetSequence(id));
  EXPECT_EQ(untouched.visible_tokens, 0) << "a refused append wrote nothing";
  EXPECT_EQ(append([](pb::AppendRequest&) {}), grpc::OK);
  client::FetchOptions layer0;
  layer0.layers = {0};
  layer0.include_unfinished = true;  // the other layers have nothing yet
  KVC_ASSERT_OK_AND_ASSIGN(const client::FetchResult got, t.client->Fetch(id, layer0));
  ASSERT_EQ(got.heads.size(), 2u);
  for (int h = 0; h < kHeads; ++h) {  // the wire layout is [token][head][dim]
    for (int tok = 0; tok < 10; ++tok) {
      const size_t row = static_cast<size_t>(kDim) * 2;
      EXPECT_EQ(std::memcmp(got.heads[h].keys.data() + tok * row,
                            data.keys.data() + (tok * kHeads + h) * row, row),
                0);
      EXPECT_EQ(std::memcmp(got.heads[h].values.data() + tok * row,
                            data.values.data() + (tok * kHeads + h) * row, row),
                0);
    }
  }

  // At most 4 regions per connection; sizes outside 4 KiB .. 1 GiB refused.
  std::vector<RawRegion> more(4);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(socket.Stage("4096", &more[i]).rfind("OK ", 0), 0u);
  EXPECT_EQ(socket.Stage("4096", &more[3]).rfind("ERR ", 0), 0u);
  RawSocket other(Options().local_socket);
  RawRegion tiny;
  EXPECT_EQ(other.Stage("100", &tiny).rfind("ERR ", 0), 0u);
  EXPECT_EQ(other.Stage("many", &tiny).rfind("ERR ", 0), 0u);

  // The region closes with its connection: the server never reads it again.
  socket.Close();
  grpc::StatusCode code = grpc::OK;
  for (int i = 0; i < 200 && code != grpc::FAILED_PRECONDITION; ++i) {
    usleep(10000);
    code = append([](pb::AppendRequest& r) { r.set_start_position(10); });
  }
  EXPECT_EQ(code, grpc::FAILED_PRECONDITION);
  ::munmap(p, 65536);
  for (RawRegion& r : more) {
    if (r.fd >= 0) ::close(r.fd);
  }
  ::close(region.fd);
}

TEST_F(StagedAppendTest, AServerWithoutTheSocketRefusesStagedAppends) {
  cachesvc::ServerOptions o = Options();
  o.local_socket.clear();
  testing::TestServer t = testing::StartTestServer(o);
  auto kv = pb::KvCacheService::NewStub(
      grpc::CreateChannel(t.server->address(), grpc::InsecureChannelCredentials()));
  pb::AppendRequest r;
  r.set_sequence_id(t.client->CreateSequence({})->sequence_id);
  r.set_num_tokens(1);
  r.mutable_staged()->set_region_id("0123");
  r.mutable_staged()->set_bytes(128);
  grpc::ClientContext context;
  pb::AppendResponse response;
  EXPECT_EQ(kv->Append(&context, r, &response).error_code(), grpc::FAILED_PRECONDITION);
  // And the client, finding no socket, appends over gRPC and says so.
  KVC_ASSERT_OK(Store(*t.client, t.client->CreateSequence({})->sequence_id, 1, 20, 20, false));
  EXPECT_EQ(t.client->AppendPath(), "grpc (the server has no local_socket)");
}

}  // namespace
}  // namespace kvc
