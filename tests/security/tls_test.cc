// kvcached over TLS and mTLS through the real client library: handshakes that must work,
// handshakes that must fail, certificate rotation under traffic, and startup errors.
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/token_hash.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "tests/security/certs.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_server.h"

namespace kvc {
namespace {

using client::ClientOptions;
using client::KvCacheClient;
using ::kvc::testing::CertFile;
using ::kvc::testing::StatusIs;
using Code = absl::StatusCode;

constexpr int kLayers = 4, kHeads = 2, kDim = 32, kTokens = 16;

cachesvc::ServerOptions TlsServer(const std::string& cert, const std::string& key,
                                  const std::string& client_ca = "",
                                  bool require_client_cert = false) {
  cachesvc::ServerOptions options = ::kvc::testing::SmallServerOptions();
  options.tls.cert_file = cert;
  options.tls.key_file = key;
  options.tls.client_ca_file = client_ca;
  options.tls.require_client_cert = require_client_cert;
  options.tls.reload_interval_seconds = 1;
  return options;
}

std::unique_ptr<cachesvc::KvCacheServer> Start(const cachesvc::ServerOptions& options) {
  auto server = cachesvc::KvCacheServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// make_certs.sh file names; empty = not set.
struct ClientTls {
  std::string ca = "", cert = "", key = "", server_name = "";
};

std::unique_ptr<KvCacheClient> Connect(const std::string& target, const ClientTls& tls) {
  ClientOptions options;
  options.target = target;
  options.tls.ca_file = tls.ca.empty() ? "" : CertFile(tls.ca);
  options.tls.cert_file = tls.cert.empty() ? "" : CertFile(tls.cert);
  options.tls.key_file = tls.key.empty() ? "" : CertFile(tls.key);
  options.tls.server_name = tls.server_name;
  options.max_attempts = 1;
  options.default_deadline = absl::Seconds(5);
  auto client = KvCacheClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Create, Append every layer, Fetch and compare every byte.
absl::Status RoundTrip(KvCacheClient& client) {
  auto seq = client.CreateSequence({});
  if (!seq.ok()) return seq.status();
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::string keys = ::kvc::testing::MakeKv(3, layer, 0, kTokens, kHeads, kDim,
                                                    kernels::DType::kF16, /*is_value=*/false);
    const std::string values = ::kvc::testing::MakeKv(3, layer, 0, kTokens, kHeads, kDim,
                                                      kernels::DType::kF16, /*is_value=*/true);
    auto appended = client.Append({seq->sequence_id, layer, /*start_position=*/0, kTokens,
                                   client::DType::kF16, keys.data(), values.data(), keys.size()});
    if (!appended.ok()) return appended.status();
  }
  auto fetched = client.Fetch(seq->sequence_id, {});
  if (!fetched.ok()) return fetched.status();
  if (fetched->heads.size() != static_cast<size_t>(kLayers * kHeads)) {
    return absl::InternalError("Fetch returned the wrong number of heads");
  }
  for (const auto& head : fetched->heads) {
    if (head.keys != ::kvc::testing::MakeHeadKv(3, head.layer, head.kv_head, 0, kTokens, kDim,
                                                kernels::DType::kF16, /*is_value=*/false)) {
      return absl::InternalError("Fetch returned other keys than were appended");
    }
  }
  return client.Release(seq->sequence_id).status();
}

// The first call fails: the handshake is refused, UNAVAILABLE. When the client refuses, the
// message says why (`reason`); when the server does, the client only sees the socket close.
void ExpectHandshakeFails(KvCacheClient& client, const std::string& reason = "") {
  const absl::Status status = client.CreateSequence({}).status();
  EXPECT_THAT(status, StatusIs(Code::kUnavailable)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), reason)) << status;
}

TEST(TlsTest, RoundTripThroughTheClient) {
  auto server = Start(TlsServer(CertFile("server.pem"), CertFile("server.key")));
  auto client = Connect(server->address(), {"ca.pem"});
  KVC_EXPECT_OK(RoundTrip(*client));
}

TEST(TlsTest, ServerNameOverrideIsVerified) {
  auto server = Start(TlsServer(CertFile("server.pem"), CertFile("server.key")));
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem", "", "", "localhost"})));
  ExpectHandshakeFails(*Connect(server->address(), {"ca.pem", "", "", "other.example"}),
                       "Peer name other.example is not in peer certificate");
}

TEST(TlsTest, ClientTrustingAnotherCaFailsTheHandshake) {
  auto server = Start(TlsServer(CertFile("server.pem"), CertFile("server.key")));
  auto client = Connect(server->address(), {"other-ca.pem"});
  const absl::Status status = client->CreateSequence({}).status();
  EXPECT_THAT(status, StatusIs(Code::kUnavailable)) << status;
  EXPECT_TRUE(absl::StrContains(absl::AsciiStrToLower(status.message()), "handshake")) << status;
}

TEST(TlsTest, ExpiredServerCertificateIsRefused) {
  // It starts (the pair matches); clients refuse it at the handshake.
  auto server = Start(TlsServer(CertFile("server-expired.pem"), CertFile("server-expired.key")));
  ExpectHandshakeFails(*Connect(server->address(), {"ca.pem"}), "certificate verify failed");
}

TEST(TlsTest, PlaintextClientCannotUseTheTlsPort) {
  auto server = Start(TlsServer(CertFile("server.pem"), CertFile("server.key")));
  auto client = Connect(server->address(), {});
  EXPECT_THAT(client->CreateSequence({}), StatusIs(Code::kUnavailable));
}

TEST(TlsTest, TlsClientCannotUseAPlaintextPort) {
  auto server = Start(::kvc::testing::SmallServerOptions());
  ExpectHandshakeFails(*Connect(server->address(), {"ca.pem"}), "Ssl handshake failed");
}

TEST(MutualTlsTest, RequiredClientCertificate) {
  auto server = Start(TlsServer(CertFile("server.pem"), CertFile("server.key"), CertFile("ca.pem"),
                                /*require_client_cert=*/true));
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem", "client-a.pem", "client-a.key"})));
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem", "client-b.pem", "client-b.key"})));
  {
    SCOPED_TRACE("no client certificate");
    ExpectHandshakeFails(*Connect(server->address(), {"ca.pem"}));
  }
  {
    SCOPED_TRACE("expired client certificate");
    ExpectHandshakeFails(
        *Connect(server->address(), {"ca.pem", "client-expired.pem", "client-expired.key"}));
  }
  {
    SCOPED_TRACE("client certificate of another CA");
    ExpectHandshakeFails(
        *Connect(server->address(), {"ca.pem", "client-other-ca.pem", "client-other-ca.key"}));
  }
}

TEST(MutualTlsTest, OptionalClientCertificateMustStillVerify) {
  // Without require_client_cert a client may come without a certificate (to use a token);
  // one it presents must verify.
  auto server =
      Start(TlsServer(CertFile("server.pem"), CertFile("server.key"), CertFile("ca.pem")));
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem"})));
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem", "client-a.pem", "client-a.key"})));
  ExpectHandshakeFails(
      *Connect(server->address(), {"ca.pem", "client-expired.pem", "client-expired.key"}));
}

// Writes `from`'s bytes to `to`.
void CopyFile(const std::string& from, const std::string& to) {
  std::FILE* in = std::fopen(from.c_str(), "rb");
  std::FILE* out = std::fopen(to.c_str(), "wb");
  ASSERT_NE(in, nullptr) << from;
  ASSERT_NE(out, nullptr) << to;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), in)) > 0) std::fwrite(buffer, 1, n, out);
  std::fclose(in);
  ASSERT_EQ(std::fclose(out), 0);
}

TEST(TlsRotationTest, NewConnectionsGetTheNewCertificateWithoutFailedCalls) {
  // The layout of a Kubernetes Secret volume: the files are read through a directory
  // symlink, and one rename swaps the key and the certificate together.
  const std::string dir = CertFile("rotation");
  ASSERT_EQ(::system(("rm -rf " + dir + " && mkdir -p " + dir + "/v1 " + dir + "/v2").c_str()), 0);
  CopyFile(CertFile("server.pem"), dir + "/v1/tls.crt");
  CopyFile(CertFile("server.key"), dir + "/v1/tls.key");
  CopyFile(CertFile("server-rotated.pem"), dir + "/v2/tls.crt");
  CopyFile(CertFile("server-rotated.key"), dir + "/v2/tls.key");
  ASSERT_EQ(::symlink("v1", (dir + "/current").c_str()), 0);
  auto server = Start(TlsServer(dir + "/current/tls.crt", dir + "/current/tls.key"));
  ASSERT_NE(server, nullptr);

  // Only the new certificate names rotated.kvcache.test.
  ExpectHandshakeFails(*Connect(server->address(), {"ca.pem", "", "", "rotated.kvcache.test"}),
                       "not in peer certificate");

  // Traffic on one channel throughout: it keeps its connection, so no call may fail.
  auto busy = Connect(server->address(), {"ca.pem"});
  auto seq = busy->CreateSequence({});
  ASSERT_TRUE(seq.ok()) << seq.status();
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, failures{0};
  std::string first_failure;
  std::thread traffic([&] {
    while (!stop.load()) {
      const absl::Status status = busy->GetSequence(seq->sequence_id).status();
      if (!status.ok() && failures.fetch_add(1) == 0) first_failure = status.ToString();
      calls.fetch_add(1);
    }
  });
  absl::SleepFor(absl::Milliseconds(200));

  ASSERT_EQ(::symlink("v2", (dir + "/next").c_str()), 0);
  ASSERT_EQ(::rename((dir + "/next").c_str(), (dir + "/current").c_str()), 0);

  // reload_interval_seconds is 1: within a few seconds a new connection gets the new pair.
  absl::Status rotated = absl::UnknownError("not tried");
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  while (absl::Now() < give_up) {
    rotated = Connect(server->address(), {"ca.pem", "", "", "rotated.kvcache.test"})
                  ->CreateSequence({})
                  .status();
    if (rotated.ok()) break;
    absl::SleepFor(absl::Milliseconds(250));
  }
  absl::SleepFor(absl::Milliseconds(200));
  stop.store(true);
  traffic.join();
  KVC_EXPECT_OK(rotated) << "new connections never got the rotated certificate";
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_GT(calls.load(), 10);
  // The new certificate still names 127.0.0.1, so a fresh default client works too.
  KVC_EXPECT_OK(RoundTrip(*Connect(server->address(), {"ca.pem"})));
}

TEST(TlsStartupTest, MissingOrMismatchedFilesFailStartupNamingTheFile) {
  const std::string missing = CertFile("no-such.pem");
  EXPECT_THAT(cachesvc::KvCacheServer::Start(TlsServer(missing, CertFile("server.key"))),
              StatusIs(Code::kInvalidArgument, missing));
  EXPECT_THAT(cachesvc::KvCacheServer::Start(TlsServer(CertFile("server.pem"), missing)),
              StatusIs(Code::kInvalidArgument, missing));
  EXPECT_THAT(
      cachesvc::KvCacheServer::Start(TlsServer(CertFile("server.pem"), CertFile("client-a.key"))),
      StatusIs(Code::kInvalidArgument, "is not the private key of"));
  EXPECT_THAT(
      cachesvc::KvCacheServer::Start(TlsServer(CertFile("server.key"), CertFile("server.key"))),
      StatusIs(Code::kInvalidArgument, "holds no PEM certificate"));
  EXPECT_THAT(
      cachesvc::KvCacheServer::Start(TlsServer(CertFile("server.pem"), CertFile("server.pem"))),
      StatusIs(Code::kInvalidArgument, "holds no unencrypted PEM private key"));
  EXPECT_THAT(cachesvc::KvCacheServer::Start(
                  TlsServer(CertFile("server.pem"), CertFile("server.key"), missing, true)),
              StatusIs(Code::kInvalidArgument, missing));
}

TEST(TlsClientOptionsTest, UnreadableOrInconsistentFilesAreInvalidArgument) {
  ClientOptions options;
  options.tls.ca_file = CertFile("no-such-ca.pem");
  EXPECT_THAT(KvCacheClient::Connect(options),
              StatusIs(Code::kInvalidArgument, options.tls.ca_file));
  options.tls.ca_file = CertFile("ca.pem");
  options.tls.cert_file = CertFile("client-a.pem");
  EXPECT_THAT(KvCacheClient::Connect(options), StatusIs(Code::kInvalidArgument, "key"));
  options.tls.key_file = CertFile("no-such.key");
  EXPECT_THAT(KvCacheClient::Connect(options),
              StatusIs(Code::kInvalidArgument, options.tls.key_file));
  options.tls = {};
  options.tls.server_name = "localhost";
  EXPECT_THAT(KvCacheClient::Connect(options), StatusIs(Code::kInvalidArgument, "CA file"));
  options.tls = {};
  options.bearer_token = "two words";
  EXPECT_THAT(KvCacheClient::Connect(options), StatusIs(Code::kInvalidArgument, "bearer_token"));
}

// mTLS client certificates as credentials: a verified certificate whose SAN is listed in
// auth.client_identities is that tenant; a verified but unlisted one, or none, is refused
// unless a bearer token comes with the call.
TEST(CertificateIdentityTest, AListedSanIsItsTenantAndOthersAreUnauthenticated) {
  cachesvc::ServerOptions options =
      TlsServer(CertFile("server.pem"), CertFile("server.key"), CertFile("ca.pem"));
  options.auth.client_identities.push_back(
      {"spiffe://kvcache/tenant-a", "team-a", cachesvc::Role::kTenant});
  const std::string tokens = ::kvc::testing::CertDir() + "/identity-tokens";
  const std::string admin_token = "admin-token-for-the-identity-test";
  const std::string salt = *RandomBytes(16);
  std::FILE* f = std::fopen(tokens.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "ops admin %s %s\n", ToHex(salt).c_str(),
               TokenHashHex(salt, admin_token).c_str());
  std::fclose(f);
  options.auth.tokens_file = tokens;
  auto server = Start(options);
  ASSERT_NE(server, nullptr);

  auto a = Connect(server->address(), {"ca.pem", "client-a.pem", "client-a.key"});
  client::CreateSequenceOptions create;
  create.client_sequence_id = "doc";
  auto created = a->CreateSequence(create);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->tenant, "team-a");
  KVC_EXPECT_OK(RoundTrip(*a));

  // client-b's certificate verifies but its SAN (DNS tenant-b.example) is not listed.
  auto b = Connect(server->address(), {"ca.pem", "client-b.pem", "client-b.key"});
  EXPECT_THAT(b->CreateSequence({}), StatusIs(Code::kUnauthenticated, "subject alternative"));
  auto anonymous = Connect(server->address(), {"ca.pem"});
  EXPECT_THAT(anonymous->GetSequence("doc"), StatusIs(Code::kUnauthenticated, "no credentials"));

  // A token decides when one is sent, also over a certificate: here, the admin's.
  ClientOptions admin_options;
  admin_options.target = server->address();
  admin_options.tls.ca_file = CertFile("ca.pem");
  admin_options.tls.cert_file = CertFile("client-b.pem");
  admin_options.tls.key_file = CertFile("client-b.key");
  admin_options.bearer_token = admin_token;
  auto admin = KvCacheClient::Connect(admin_options);
  ASSERT_TRUE(admin.ok());
  auto listed = kvc::client::AdminClient::Over(**admin).ListSequences({});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->sequences.size(), 1u);
  EXPECT_EQ(listed->sequences[0].tenant, "team-a");
  EXPECT_THAT((*admin)->GetSequence("doc"), StatusIs(Code::kNotFound))
      << "the admin's own id space has no 'doc'";
}

}  // namespace
}  // namespace kvc
