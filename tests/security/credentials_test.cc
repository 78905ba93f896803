// What clients send to authenticate: the bearer token on every kind of call (a recording
// gRPC server sees the metadata), kvcachectl's TLS and token flags, and hash-token's line.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/token_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "tests/security/certs.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using ::kvc::testing::CertFile;
using ::kvc::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using Code = absl::StatusCode;

// Answers every method UNIMPLEMENTED and records (method, authorization metadata).
class RecordingService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    std::string authorization = "(none)";
    for (const auto& [key, value] : context->client_metadata()) {
      if (key == "authorization") authorization.assign(value.data(), value.size());
    }
    {
      absl::MutexLock lock(&mu_);
      calls_.emplace_back(context->method(), authorization);
    }
    return new Refuse();
  }

  std::vector<std::pair<std::string, std::string>> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  class Refuse final : public grpc::ServerGenericBidiReactor {
   public:
    Refuse() { Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "recording only")); }
    void OnDone() override { delete this; }  // gRPC's reactor contract
  };

  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> calls_ ABSL_GUARDED_BY(mu_);
};

class RecordingServer {
 public:
  RecordingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~RecordingServer() { server_->Shutdown(); }
  RecordingServer(const RecordingServer&) = delete;
  RecordingServer& operator=(const RecordingServer&) = delete;

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  RecordingService& service() { return service_; }

 private:
  RecordingService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(BearerTokenTest, SentOnUnaryAndStreamingCalls) {
  RecordingServer server;
  client::ClientOptions options;
  options.target = server.address();
  options.bearer_token = "tok-123";
  options.max_attempts = 1;
  auto connected = client::KvCacheClient::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  client::KvCacheClient& c = **connected;

  EXPECT_THAT(c.CreateSequence({}), StatusIs(Code::kUnimplemented));
  auto append = c.StartAppendStream();
  EXPECT_THAT(append->Finish(), StatusIs(Code::kUnimplemented));
  EXPECT_THAT(c.FetchChunks("s", {}, [](client::FetchedChunk&) { return absl::OkStatus(); }),
              StatusIs(Code::kUnimplemented));
  auto attend = c.StartAttendSession();
  EXPECT_THAT(attend->Finish(), StatusIs(Code::kUnimplemented));
  EXPECT_THAT(kvc::client::AdminClient::Over(c).ListPools(), StatusIs(Code::kUnimplemented));

  const std::string bearer = "Bearer tok-123";
  EXPECT_THAT(server.service().calls(),
              ElementsAre(Pair("/kvcache.v1.KvCacheService/CreateSequence", bearer),
                          // The first append or fetch asks whether the server offers the
                          // same-node path (staging regions, mapped pools).
                          Pair("/kvcache.v1.AdminService/GetServerInfo", bearer),
                          Pair("/kvcache.v1.KvCacheService/AppendStream", bearer),
                          Pair("/kvcache.v1.KvCacheService/Fetch", bearer),
                          Pair("/kvcache.v1.KvCacheService/AttendStream", bearer),
                          Pair("/kvcache.v1.AdminService/ListPools", bearer)));
}

struct ShellRun {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command line; stdout only (stderr goes to the test log).
ShellRun Shell(const std::string& command) {
  ShellRun run;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  std::string path = CertFile(name);
  std::ofstream(path) << contents;
  return path;
}

TEST(KvcachectlTest, TokenFromFileOrEnvironmentIsSent) {
  RecordingServer server;
  const std::string token_file = WriteFile("token", "from-file\n");
  const std::string target = " --target=" + server.address();
  // The recording server refuses every call: exit 3, "the server refused".
  EXPECT_EQ(
      Shell(absl::StrCat(KVCACHECTL, target, " --token_file=", token_file, " pools")).exit_code, 3);
  EXPECT_EQ(Shell(absl::StrCat("KVC_TOKEN=from-env ", KVCACHECTL, target, " stats")).exit_code, 3);
  EXPECT_THAT(server.service().calls(),
              ElementsAre(Pair("/kvcache.v1.AdminService/ListPools", "Bearer from-file"),
                          Pair("/kvcache.v1.AdminService/GetPoolStats", "Bearer from-env")));
  EXPECT_EQ(Shell(absl::StrCat(KVCACHECTL, target, " --token_file=", CertFile("none"), " pools"))
                .exit_code,
            1);
}

TEST(KvcachectlTest, ListsPoolsOverMutualTls) {
  cachesvc::ServerOptions options = ::kvc::testing::SmallServerOptions();
  options.tls.cert_file = CertFile("server.pem");
  options.tls.key_file = CertFile("server.key");
  options.tls.client_ca_file = CertFile("ca.pem");
  options.tls.require_client_cert = true;
  auto server = cachesvc::KvCacheServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string base = absl::StrCat(KVCACHECTL, " --target=", (*server)->address(),
                                        " --tls_ca=", CertFile("ca.pem"));
  const ShellRun ok = Shell(absl::StrCat(base, " --tls_cert=", CertFile("client-a.pem"),
                                         " --tls_key=", CertFile("client-a.key"), " pools"));
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_THAT(ok.out, HasSubstr("small"));
  // No client certificate: the handshake fails, reported as unreachable (exit 2).
  EXPECT_EQ(Shell(base + " pools").exit_code, 2);
  // A file that is not there: a usage error before any call (exit 1).
  EXPECT_EQ(Shell(base + "x pools").exit_code, 1);
}

// "tenant role salt-hex sha256-hex" whose hash is TokenHashHex(salt, token).
void ExpectLineVerifies(const std::string& line, const std::string& tenant, const std::string& role,
                        const std::string& token) {
  const std::vector<std::string> fields = absl::StrSplit(line, ' ');
  ASSERT_EQ(fields.size(), 4u) << line;
  EXPECT_EQ(fields[0], tenant);
  EXPECT_EQ(fields[1], role);
  auto salt = FromHex(fields[2]);
  ASSERT_TRUE(salt.ok()) << line;
  EXPECT_EQ(salt->size(), 16u);
  EXPECT_EQ(fields[3], TokenHashHex(*salt, token));
  EXPECT_EQ(fields[3].size(), 64u);
}

TEST(HashTokenTest, LineVerifiesAgainstTokenHash) {
  const std::string token_file = WriteFile("plain-token", "s3cret-token\n");
  const ShellRun run =
      Shell(absl::StrCat(KVCACHECTL, " hash-token --tenant=team-a --role=admin < ", token_file));
  ASSERT_EQ(run.exit_code, 0);
  const std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << run.out;
  ExpectLineVerifies(lines[0], "team-a", "admin", "s3cret-token");
  // A fresh salt each time: the same token never gives the same line.
  EXPECT_NE(
      Shell(absl::StrCat(KVCACHECTL, " hash-token --tenant=team-a --role=admin < ", token_file))
          .out,
      run.out);
}

TEST(HashTokenTest, GeneratedTokenIsPrintedAndHashed) {
  const ShellRun run =
      Shell(absl::StrCat(KVCACHECTL, " hash-token --tenant=team-b --generate </dev/null"));
  ASSERT_EQ(run.exit_code, 0);
  const std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << run.out;
  ASSERT_EQ(lines[0].rfind("token: ", 0), 0u) << lines[0];
  const std::string token = lines[0].substr(7);
  EXPECT_EQ(token.size(), 64u);
  KVC_EXPECT_OK(FromHex(token).status());
  ExpectLineVerifies(lines[1], "team-b", "tenant", token);
}

TEST(HashTokenTest, BadArgumentsAreUsageErrors) {
  EXPECT_EQ(
      Shell(absl::StrCat("echo t | ", KVCACHECTL, " hash-token --tenant=a --role=root")).exit_code,
      1);
  EXPECT_EQ(Shell(absl::StrCat("echo t | ", KVCACHECTL, " hash-token --tenant='a b'")).exit_code,
            1);
  EXPECT_EQ(Shell(absl::StrCat(KVCACHECTL, " hash-token --tenant=a </dev/null")).exit_code, 1);
}

}  // namespace
}  // namespace kvc
