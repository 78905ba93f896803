// Tenant isolation on the same-node path, tried as an attacker on this node would: a real
// kvcached with authentication (tokens for tenants a and b and an admin) and a local socket,
// tenant a's KV planted with a pattern, and peers speaking the socket's protocol by hand.
// Whatever a peer asks for, it maps no byte of another tenant's KV: no credential and bad
// credentials reach nothing, every segment index at every epoch it could guess is refused
// unless its own tenant holds it, a scan of everything it could map finds no planted byte,
// another tenant's staging region is refused, and a revoked token closes the connection.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cachesvc/server/server.h"
#include "common/token_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc::cachesvc {
namespace {

namespace pb = ::kvcache::v1;
using ::testing::HasSubstr;

constexpr char kTokenA[] = "token-of-tenant-a-0123456789abcdef";
constexpr char kTokenB[] = "token-of-tenant-b-0123456789abcdef";
constexpr char kTokenAdmin[] = "token-of-the-admin-0123456789abcd";
// What tenant a's KV is made of: a peer that finds these bytes read a's KV.
constexpr char kMarker[] = "A-SECRET-KV-ROW!";  // 16 bytes

std::string TokenLine(const std::string& tenant, const std::string& role,
                      const std::string& token) {
  const std::string salt = *RandomBytes(16);
  return absl::StrCat(tenant, " ", role, " ", ToHex(salt), " ", TokenHashHex(salt, token), "\n");
}

void WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

// A peer on the local socket, speaking its protocol line by line.
class Peer {
 public:
  explicit Peer(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    EXPECT_EQ(::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int unused = -1;
    greeting_ = Line(&unused);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  const std::string& greeting() const { return greeting_; }
  // Sends `request` (a line without its newline) and returns the reply line, or "<closed>";
  // `fd` receives a descriptor sent with it (-1 if none).
  std::string Ask(const std::string& request, int* fd = nullptr) {
    const std::string line = request + "\n";
    if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
      return "<closed>";
    }
    int passed = -1;
    std::string reply = Line(&passed);
    if (fd != nullptr) {
      *fd = passed;
    } else if (passed >= 0) {
      ::close(passed);
    }
    return reply;
  }
  // True once the server closed its end (end of file within `within`).
  bool ClosedWithin(absl::Duration within) {
    const absl::Time until = absl::Now() + within;
    while (absl::Now() < until) {
      char c = 0;
      const ssize_t n = ::recv(fd_, &c, 1, MSG_DONTWAIT);
      if (n == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
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
  std::string greeting_;
};

// Whether the `bytes` mapped from `fd` contain the marker.
bool HoldsMarker(int fd, int64_t bytes) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  const std::string_view view(static_cast<const char*>(p), static_cast<size_t>(bytes));
  const bool found = view.find(kMarker) != std::string_view::npos;
  ::munmap(p, static_cast<size_t>(bytes));
  return found;
}

class LocalIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvc-isolation-XXXXXX";
    dir_ = mkdtemp(tmpl);
    tokens_file_ = dir_ + "/tokens";
    WriteAtomically(tokens_file_, TokenLine("a", "tenant", kTokenA) +
                                      TokenLine("b", "tenant", kTokenB) +
                                      TokenLine("ops", "admin", kTokenAdmin));
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  ServerOptions Options() {
    ServerOptions o = testing::SmallServerOptions();
    o.store.pools[0].device = "cpu";  // host pools: what the socket's segments share
    o.store.pools[0].keep_free_bytes = 0;
    o.auth.tokens_file = tokens_file_;
    o.auth.reload_interval_seconds = 1;
    o.local_socket = socket();
    o.local_socket_allow_same_uid = true;  // the peers are this test, as kvcached's uid
    o.local_staging_bytes_per_tenant = int64_t{8} << 20;
    return o;
  }
  void Start(const ServerOptions& options) {
    auto server = KvCacheServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    kv_ = pb::KvCacheService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  std::string socket() const { return dir_ + "/kvcached.sock"; }
  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
  // A sequence of `token`'s tenant with `tokens` tokens on every layer whose bytes are
  // `fill` repeated; returns its id.
  std::string Planted(const std::string& token, int tokens, const std::string& fill) {
    pb::CreateSequenceRequest create;
    pb::SequenceInfo info;
    EXPECT_TRUE(kv_->CreateSequence(Ctx(token).get(), create, &info).ok());
    const size_t bytes = static_cast<size_t>(tokens) * 2 * 32 * 2;  // n x heads x dim x f16
    std::string kv;
    while (kv.size() < bytes) kv += fill;
    kv.resize(bytes);
    for (int layer = 0; layer < 4; ++layer) {
      pb::AppendRequest r;
      r.set_sequence_id(info.sequence_id());
      r.set_layer(layer);
      r.set_num_tokens(tokens);
      r.set_keys(kv);
      r.set_values(kv);
      pb::AppendResponse response;
      const grpc::Status s = kv_->Append(Ctx(token).get(), r, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return info.sequence_id();
  }
  pb::Lease LeaseOf(const std::string& token, const std::string& id) {
    pb::LeaseRequest r;
    r.set_sequence_id(id);
    pb::Lease lease;
    const grpc::Status s = kv_->LeaseSequence(Ctx(token).get(), r, &lease);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return lease;
  }

  std::string dir_;
  std::string tokens_file_;
  std::unique_ptr<KvCacheServer> server_;
  std::unique_ptr<pb::KvCacheService::Stub> kv_;
};

TEST_F(LocalIsolationTest, APeerWithoutAValidCredentialReachesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  Planted(kTokenA, 40, kMarker);
  const std::string fmt = absl::StrCat(pb::STORAGE_FORMAT_F16);
  {
    Peer p(socket());
    EXPECT_THAT(p.greeting(), ::testing::StartsWith("KVC-LOCAL 2 "));
    EXPECT_THAT(p.Ask("ARENA small " + fmt), HasSubstr("ERR authenticate first"));
    EXPECT_TRUE(p.ClosedWithin(absl::Seconds(2)));
  }
  for (const std::string& bad : std::vector<std::string>{"-", "token-of-nobody-0123456789abcdefgh",
                                                         kTokenA + std::string("x")}) {
    Peer p(socket());
    EXPECT_THAT(p.Ask("AUTH " + bad), ::testing::StartsWith("ERR ")) << bad;
    EXPECT_TRUE(p.ClosedWithin(absl::Seconds(2))) << bad;
  }
  for (const std::string& request :
       {std::string("SEGMENT small ") + fmt + " 0 1", std::string("STAGE 65536")}) {
    Peer p(socket());
    EXPECT_THAT(p.Ask(request), HasSubstr("ERR authenticate first")) << request;
  }
  {
    Peer silent(socket());  // says nothing: dropped once kAuthWithin passed
    EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(8)));
  }
}

// Tenant b and the admin, each authenticated, ask for every segment index of a's format at
// every epoch up to far beyond any the server used, and for a's exact (index, epoch) from a's
// own lease: only their own tenant's segments come back, and none holds a byte of a's KV.
TEST_F(LocalIsolationTest, EveryGuessOfAnotherTenantsSegmentsIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  const std::string a_seq = Planted(kTokenA, 100, kMarker);
  Planted(kTokenB, 60, "b-own-bytes-here");
  const pb::Lease a_lease = LeaseOf(kTokenA, a_seq);
  ASSERT_EQ(a_lease.arenas_size(), 1);
  ASSERT_GT(a_lease.arenas(0).segments_size(), 0);
  const std::string fmt = absl::StrCat(pb::STORAGE_FORMAT_F16);

  // a itself maps its segment and finds its bytes: the scan below can see the marker.
  {
    Peer a(socket());
    ASSERT_EQ(a.Ask(absl::StrCat("AUTH ", kTokenA)), "OK");
    const pb::LeaseArenaSegment& seg = a_lease.arenas(0).segments(0);
    int fd = -1;
    const std::string reply =
        a.Ask(absl::StrCat("SEGMENT small ", fmt, " ", seg.index(), " ", seg.epoch()), &fd);
    ASSERT_THAT(reply, ::testing::StartsWith("OK ")) << reply;
    int64_t bytes = 0;
    ASSERT_TRUE(absl::SimpleAtoi(reply.substr(3), &bytes));
    EXPECT_TRUE(HoldsMarker(fd, bytes));
    ::close(fd);
  }
  for (const char* token : {kTokenB, kTokenAdmin}) {
    SCOPED_TRACE(token);
    Peer p(socket());
    ASSERT_EQ(p.Ask(absl::StrCat("AUTH ", token)), "OK");
    const std::string shape = p.Ask("ARENA small " + fmt);
    const std::vector<std::string> words = absl::StrSplit(shape, ' ');
    ASSERT_EQ(words.size(), 4u) << shape;
    int64_t bytes = 0, segment = 0;
    ASSERT_TRUE(absl::SimpleAtoi(words[1], &bytes) && absl::SimpleAtoi(words[3], &segment));
    for (const pb::LeaseArenaSegment& seg : a_lease.arenas(0).segments()) {
      EXPECT_THAT(p.Ask(absl::StrCat("SEGMENT small ", fmt, " ", seg.index(), " ", seg.epoch())),
                  HasSubstr("holds none of this tenant's blocks"));
    }
    int granted = 0;
    for (int64_t index = 0; index < std::min<int64_t>(bytes / segment, 16); ++index) {
      for (uint64_t epoch = 0; epoch < 64; ++epoch) {
        int fd = -1;
        const std::string reply =
            p.Ask(absl::StrCat("SEGMENT small ", fmt, " ", index, " ", epoch), &fd);
        if (fd < 0) {
          EXPECT_THAT(reply, ::testing::StartsWith("ERR ")) << index << " " << epoch;
          continue;
        }
        ++granted;
        EXPECT_FALSE(HoldsMarker(fd, segment)) << "tenant a's KV in segment " << index;
        ::close(fd);
      }
    }
    // b holds one segment of its own; the admin's tenant holds none.
    EXPECT_EQ(granted, token == kTokenB ? 1 : 0);
  }
}

// Staging regions: another tenant's region id names nothing, and each tenant's open regions
// count against its budget.
TEST_F(LocalIsolationTest, StagingRegionsBelongToTheTenantThatOpenedThem) {
  ASSERT_NO_FATAL_FAILURE(Start(Options()));
  Peer a(socket());
  ASSERT_EQ(a.Ask(absl::StrCat("AUTH ", kTokenA)), "OK");
  int fd = -1;
  const std::string opened = a.Ask("STAGE 4194304", &fd);
  ASSERT_THAT(opened, ::testing::StartsWith("OK ")) << opened;
  const std::string region = std::vector<std::string>(absl::StrSplit(opened, ' '))[1];
  void* p = ::mmap(nullptr, 4194304, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x11, 4194304);
  ::close(fd);

  // b names a's region in an Append to b's own sequence: refused, nothing appended.
  pb::CreateSequenceRequest create;
  pb::SequenceInfo b_seq;
  ASSERT_TRUE(kv_->CreateSequence(Ctx(kTokenB).get(), create, &b_seq).ok());
  pb::AppendRequest append;
  append.set_sequence_id(b_seq.sequence_id());
  append.set_num_tokens(16);
  append.mutable_staged()->set_region_id(region);
  append.mutable_staged()->set_bytes(16 * 2 * 32 * 2);
  append.mutable_staged()->set_values_offset(65536);
  pb::AppendResponse response;
  const grpc::Status refused = kv_->Append(Ctx(kTokenB).get(), append, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("is not open on this server"));
  pb::GetSequenceRequest get;
  get.set_sequence_id(b_seq.sequence_id());
  pb::SequenceInfo after;
  ASSERT_TRUE(kv_->GetSequence(Ctx(kTokenB).get(), get, &after).ok());
  EXPECT_EQ(after.visible_tokens(), 0);
  // a's own Append through it works.
  pb::CreateSequenceRequest create_a;
  pb::SequenceInfo a_seq;
  ASSERT_TRUE(kv_->CreateSequence(Ctx(kTokenA).get(), create_a, &a_seq).ok());
  append.set_sequence_id(a_seq.sequence_id());
  const grpc::Status mine = kv_->Append(Ctx(kTokenA).get(), append, &response);
  EXPECT_TRUE(mine.ok()) << mine.error_message();

  // The budget (8 MiB per tenant here): a third 4 MiB region is refused; b has its own.
  EXPECT_THAT(a.Ask("STAGE 4194304"), ::testing::StartsWith("OK "));
  EXPECT_THAT(a.Ask("STAGE 4194304"), HasSubstr("would pass the staging budget"));
  Peer b(socket());
  ASSERT_EQ(b.Ask(absl::StrCat("AUTH ", kTokenB)), "OK");
  EXPECT_THAT(b.Ask("STAGE 4194304"), ::testing::StartsWith("OK "));
  ::munmap(p, 4194304);
}

// Revoking a token closes the connections it opened within about a second and refuses it on
// new ones. What such a peer had already mapped keeps showing that tenant's segments as they
// are until each is released: then it reads zeros (its pages are returned), never the next
// owner's bytes.
TEST_F(LocalIsolationTest, RevokingATokenEndsItsSameNodeAccess) {
  ServerOptions o = Options();
  o.store.leases.default_ttl_ms = 2000;  // a's lease ends soon after a is revoked
  ASSERT_NO_FATAL_FAILURE(Start(o));
  const std::string a_seq = Planted(kTokenA, 100, kMarker);
  const pb::Lease a_lease = LeaseOf(kTokenA, a_seq);
  const pb::LeaseArenaSegment seg = a_lease.arenas(0).segments(0);
  const std::string fmt = absl::StrCat(pb::STORAGE_FORMAT_F16);
  Peer a(socket());
  ASSERT_EQ(a.Ask(absl::StrCat("AUTH ", kTokenA)), "OK");
  int fd = -1;
  const std::string reply =
      a.Ask(absl::StrCat("SEGMENT small ", fmt, " ", seg.index(), " ", seg.epoch()), &fd);
  ASSERT_THAT(reply, ::testing::StartsWith("OK "));
  int64_t bytes = 0;
  ASSERT_TRUE(absl::SimpleAtoi(reply.substr(3), &bytes));
  void* mapped = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  ::close(fd);
  const std::string_view view(static_cast<const char*>(mapped), static_cast<size_t>(bytes));
  ASSERT_NE(view.find(kMarker), std::string_view::npos);

  WriteAtomically(tokens_file_,
                  TokenLine("b", "tenant", kTokenB) + TokenLine("ops", "admin", kTokenAdmin));
  ASSERT_TRUE(server_->ReloadCredentials().ok());
  EXPECT_TRUE(a.ClosedWithin(absl::Seconds(3))) << "the revoked token's connection stays open";
  Peer again(socket());
  EXPECT_THAT(again.Ask(absl::StrCat("AUTH ", kTokenA)), ::testing::StartsWith("ERR "));
  EXPECT_NE(view.find(kMarker), std::string_view::npos) << "as documented: mapped, still there";

  // The admin evicts a's sequence and a's lease runs out (a, revoked, cannot end it): the
  // segment's blocks are free, and with keep_free_bytes 0 the trimmer returns the segment, so
  // the old mapping reads zeros.
  std::unique_ptr<pb::AdminService::Stub> admin = pb::AdminService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  pb::EvictSequenceRequest evict;
  evict.set_sequence_id(a_seq);
  evict.set_tenant("a");
  pb::EvictSequenceResponse evicted;
  const grpc::Status status = admin->EvictSequence(Ctx(kTokenAdmin).get(), evict, &evicted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  bool zeroed = false;
  while (absl::Now() < until && !zeroed) {
    zeroed = view.find(kMarker) == std::string_view::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(zeroed) << "the released segment's pages stayed readable";
  ::munmap(mapped, static_cast<size_t>(bytes));
}

// kvcached's own uid is admitted only when the config says so, and a socket that would admit
// no uid at all does not start.
TEST_F(LocalIsolationTest, KvcachedsOwnUidIsRefusedUnlessAllowed) {
  ServerOptions o = Options();
  o.local_socket_allow_same_uid = false;
  o.local_socket_uids = {65534};
  ASSERT_NO_FATAL_FAILURE(Start(o));
  {
    Peer p(socket());
    EXPECT_THAT(p.greeting(), HasSubstr("is kvcached's own uid, which may not connect"));
  }
  server_.reset();
  o.local_socket_uids.clear();
  EXPECT_THAT(KvCacheServer::Start(o).status(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, "admits no uid"));
}

}  // namespace
}  // namespace kvc::cachesvc
