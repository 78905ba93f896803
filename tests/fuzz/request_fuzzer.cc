// request_fuzzer: every request of kvcache.v1 KvCacheService and AdminService, parsed from
// fuzzer bytes and sent to a real kvcached (KvCacheServer: both services, access control,
// call limits, a KvStore with the CPU backend) over a unix socket, one per process.
//
//   byte 0 picks the RPC (the three streaming ones included, with one request message);
//   the rest is parsed as that RPC's request message. Bytes that do not parse are skipped.
//
// Before each input the fuzzer creates sequence "fz" (12 tokens on both layers of pool "f")
// so that requests naming it reach the core; the seed corpus and the dictionary use that
// id. After each input every sequence is released, every lease the input was granted is
// ended (LeaseSequence answers carry their ids), draining is switched off, and the pools must
// be back to zero blocks (no block leaked by any path, leases included).
//
// A refusal must carry a specific code that tells the caller what to fix; UNKNOWN, INTERNAL
// (a bug on validated input), DATA_LOSS and UNIMPLEMENTED are findings and abort. So does a
// crash, a sanitizer report, a leak or a pool that is not empty after the cleanup.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cachesvc/server/server.h"
#include "google/protobuf/stubs/logging.h"
#include "kvcache/v1/admin_service.grpc.pb.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/testing/kv_data.h"

namespace {

namespace v1 = ::kvcache::v1;
using kvc::cachesvc::KvCacheServer;

constexpr char kSeeded[] = "fz";
constexpr int kSeededTokens = 12;

struct Harness {
  std::unique_ptr<KvCacheServer> server;
  std::unique_ptr<v1::KvCacheService::Stub> kv;
  std::unique_ptr<v1::AdminService::Stub> admin;
  std::vector<std::string> leases;  // granted by the current input; ended by Cleanup
};

// Two small pools: "f" (f16, RoPE, 2 layers x 2 kv heads x 4 query heads x d 32, 8 tokens a
// block, 16 blocks: "fz" holds 8) and "b" (f32, d 16, 4 tokens a block, 32 blocks). Small enough
// that an Append of a few hundred tokens or a dozen sequences reach RESOURCE_EXHAUSTED.
kvc::cachesvc::ServerOptions Options(const std::string& socket) {
  kvc::cachesvc::ServerOptions options;
  options.listen = "unix:" + socket;
  options.max_message_bytes = int64_t{1} << 20;
  kvc::cachesvc::PoolOptions f;
  f.name = "f";
  f.geometry.num_layers = 2;
  f.geometry.num_kv_heads = 2;
  f.geometry.num_query_heads = 4;
  f.geometry.head_dim = 32;
  f.geometry.block_tokens = 8;
  f.geometry.dtype = kvc::kernels::DType::kF16;
  f.geometry.rope.enabled = true;
  f.geometry.rope.theta = 10000;
  f.capacity_bytes = 16 * 2 * 8 * 32 * 2;
  kvc::cachesvc::PoolOptions b;
  b.name = "b";
  b.geometry.num_layers = 1;
  b.geometry.num_kv_heads = 1;
  b.geometry.num_query_heads = 2;
  b.geometry.head_dim = 16;
  b.geometry.block_tokens = 4;
  b.geometry.dtype = kvc::kernels::DType::kF32;
  b.capacity_bytes = 32 * 2 * 4 * 16 * 4;
  options.store.pools = {f, b};
  options.store.max_sequences = 16;
  // Transfer channels: the fuzzer cannot connect to one, so its RPCs meet every refusal
  // (unknown, unconnected, too many) but never a payload.
  options.transfer_listen = "127.0.0.1:0";
  return options;
}

Harness& GetHarness() {
  static Harness* h = [] {
    // Most mutated messages hold invalid UTF-8 in a string field; protobuf logs each one
    // (client and server side), which would cost more than the call itself.
    google::protobuf::SetLogHandler(nullptr);
    auto* out = new Harness;
    const std::string socket = "/tmp/kvc-request-fuzzer-" + std::to_string(getpid()) + ".sock";
    unlink(socket.c_str());
    auto server = KvCacheServer::Start(Options(socket));
    if (!server.ok()) {
      std::fprintf(stderr, "request_fuzzer: cannot start kvcached: %s\n",
                   server.status().ToString().c_str());
      std::abort();
    }
    out->server = *std::move(server);
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    out->kv = v1::KvCacheService::NewStub(channel);
    out->admin = v1::AdminService::NewStub(channel);
    return out;
  }();
  return *h;
}

void Seed(kvc::cachesvc::KvStore& store) {
  kvc::cachesvc::CreateSequenceParams c;
  c.pool = "f";
  c.client_sequence_id = kSeeded;
  if (!store.CreateSequence(c).ok()) std::abort();
  for (int layer = 0; layer < 2; ++layer) {
    const std::string k = kvc::testing::MakeKv(7, layer, 0, kSeededTokens, 2, 32,
                                               kvc::kernels::DType::kF16, /*is_value=*/false);
    const std::string v = kvc::testing::MakeKv(7, layer, 0, kSeededTokens, 2, 32,
                                               kvc::kernels::DType::kF16, /*is_value=*/true);
    kvc::cachesvc::AppendParams a;
    a.sequence_id = kSeeded;
    a.layer = layer;
    a.num_tokens = kSeededTokens;
    a.keys = k;
    a.values = v;
    if (!store.Append(a).ok()) std::abort();
  }
}

// Releases every sequence of every scope, then ends the leases the input was granted (they
// keep their blocks past Release), and checks that no block stays in use.
void Cleanup(Harness& h) {
  KvCacheServer& server = *h.server;
  server.SetDraining(false);
  kvc::cachesvc::KvStore& store = *server.store();
  auto list = store.stats().ListSequences(kvc::cachesvc::ListSequencesParams{});
  if (!list.ok()) std::abort();
  // No authentication here, so every sequence and lease is in scope "".
  for (const auto& s : list->sequences) (void)store.Release(s.id);
  for (const std::string& lease : h.leases)
    (void)store.leases().ReleaseLease(kvc::cachesvc::TenantScope(), lease);
  h.leases.clear();
  for (const char* pool : {"f", "b"}) {
    auto stats = store.stats().GetPoolStats(pool);
    // A published prefix stays cached (held by the index alone, "unreferenced") after its
    // sequences are gone; anything else still held is a leak.
    const int64_t held =
        stats.ok() ? stats->used_bytes - stats->prefix_cache.unreferenced_bytes : -1;
    if (!stats.ok() || held != 0 || stats->sequences != 0 ||
        stats->prefix_cache.unreferenced_bytes != stats->prefix_cache.cached_bytes) {
      std::fprintf(stderr,
                   "request_fuzzer FINDING: pool %s holds %lld bytes beyond its unreferenced "
                   "prefix cache, %lld sequences after releasing every sequence\n",
                   pool, static_cast<long long>(held),
                   stats.ok() ? static_cast<long long>(stats->sequences) : -1LL);
      std::abort();
    }
  }
}

void CheckStatus(const grpc::Status& s, const char* rpc) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::UNIMPLEMENTED:
      std::fprintf(stderr, "request_fuzzer FINDING: %s answered code %d: %s\n", rpc,
                   static_cast<int>(s.error_code()), s.error_message().c_str());
      std::abort();
    default:
      return;
  }
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* r) {
  return r->ParseFromArray(data, static_cast<int>(size));
}

template <typename Request, typename Response, typename Call>
void Unary(const uint8_t* data, size_t size, const char* rpc, Call call) {
  Request request;
  if (!Parse(data, size, &request)) return;
  Response response;
  grpc::ClientContext context;
  CheckStatus(call(&context, request, &response), rpc);
}

// Each RPC of both services. The index is byte 0 modulo the count.
void Send(Harness& h, int rpc, const uint8_t* data, size_t size) {
  v1::KvCacheService::Stub& kv = *h.kv;
  v1::AdminService::Stub& admin = *h.admin;
  switch (rpc) {
    case 0:
      return Unary<v1::CreateSequenceRequest, v1::SequenceInfo>(
          data, size, "CreateSequence",
          [&](auto* c, const auto& q, auto* r) { return kv.CreateSequence(c, q, r); });
    case 1:
      return Unary<v1::AppendRequest, v1::AppendResponse>(
          data, size, "Append",
          [&](auto* c, const auto& q, auto* r) { return kv.Append(c, q, r); });
    case 2:
      return Unary<v1::GetSequenceRequest, v1::SequenceInfo>(
          data, size, "GetSequence",
          [&](auto* c, const auto& q, auto* r) { return kv.GetSequence(c, q, r); });
    case 3:
      return Unary<v1::ReleaseRequest, v1::ReleaseResponse>(
          data, size, "Release",
          [&](auto* c, const auto& q, auto* r) { return kv.Release(c, q, r); });
    case 4:
      return Unary<v1::CompressRequest, v1::CompressResponse>(
          data, size, "Compress",
          [&](auto* c, const auto& q, auto* r) { return kv.Compress(c, q, r); });
    case 5:
      return Unary<v1::AttendRequest, v1::AttendResponse>(
          data, size, "Attend",
          [&](auto* c, const auto& q, auto* r) { return kv.Attend(c, q, r); });
    case 6: {
      v1::FetchRequest request;
      if (!Parse(data, size, &request)) return;
      grpc::ClientContext context;
      auto reader = kv.Fetch(&context, request);
      v1::FetchChunk chunk;
      while (reader->Read(&chunk)) {
      }
      return CheckStatus(reader->Finish(), "Fetch");
    }
    case 7: {
      v1::AppendRequest request;
      if (!Parse(data, size, &request)) return;
      grpc::ClientContext context;
      v1::AppendStreamResponse response;
      auto writer = kv.AppendStream(&context, &response);
      writer->Write(request);
      writer->WritesDone();
      return CheckStatus(writer->Finish(), "AppendStream");
    }
    case 8: {
      v1::AttendRequest request;
      if (!Parse(data, size, &request)) return;
      grpc::ClientContext context;
      auto stream = kv.AttendStream(&context);
      stream->Write(request);
      stream->WritesDone();
      v1::AttendResponse response;
      while (stream->Read(&response)) {
      }
      return CheckStatus(stream->Finish(), "AttendStream");
    }
    case 9:
      return Unary<v1::ListPoolsRequest, v1::ListPoolsResponse>(
          data, size, "ListPools",
          [&](auto* c, const auto& q, auto* r) { return admin.ListPools(c, q, r); });
    case 10:
      return Unary<v1::GetPoolStatsRequest, v1::PoolStats>(
          data, size, "GetPoolStats",
          [&](auto* c, const auto& q, auto* r) { return admin.GetPoolStats(c, q, r); });
    case 11:
      return Unary<v1::ListSequencesRequest, v1::ListSequencesResponse>(
          data, size, "ListSequences",
          [&](auto* c, const auto& q, auto* r) { return admin.ListSequences(c, q, r); });
    case 12:
      return Unary<v1::EvictSequenceRequest, v1::EvictSequenceResponse>(
          data, size, "EvictSequence",
          [&](auto* c, const auto& q, auto* r) { return admin.EvictSequence(c, q, r); });
    case 13:
      return Unary<v1::DrainRequest, v1::DrainResponse>(
          data, size, "Drain",
          [&](auto* c, const auto& q, auto* r) { return admin.Drain(c, q, r); });
    case 14:
      return Unary<v1::ListTenantsRequest, v1::ListTenantsResponse>(
          data, size, "ListTenants",
          [&](auto* c, const auto& q, auto* r) { return admin.ListTenants(c, q, r); });
    case 15:
      return Unary<v1::ForkSequenceRequest, v1::SequenceInfo>(
          data, size, "ForkSequence",
          [&](auto* c, const auto& q, auto* r) { return kv.ForkSequence(c, q, r); });
    case 16:
      return Unary<v1::LookupPrefixRequest, v1::LookupPrefixResponse>(
          data, size, "LookupPrefix",
          [&](auto* c, const auto& q, auto* r) { return kv.LookupPrefix(c, q, r); });
    case 17:
      return Unary<v1::PublishPrefixRequest, v1::PublishPrefixResponse>(
          data, size, "PublishPrefix",
          [&](auto* c, const auto& q, auto* r) { return kv.PublishPrefix(c, q, r); });
    case 18: {
      v1::LeaseRequest request;
      if (!Parse(data, size, &request)) return;
      grpc::ClientContext context;
      v1::Lease response;
      const grpc::Status status = kv.LeaseSequence(&context, request, &response);
      if (status.ok()) h.leases.push_back(response.lease_id());
      return CheckStatus(status, "LeaseSequence");
    }
    case 19:
      return Unary<v1::RenewLeaseRequest, v1::RenewLeaseResponse>(
          data, size, "RenewLease",
          [&](auto* c, const auto& q, auto* r) { return kv.RenewLease(c, q, r); });
    case 20:
      return Unary<v1::ReleaseLeaseRequest, v1::ReleaseLeaseResponse>(
          data, size, "ReleaseLease",
          [&](auto* c, const auto& q, auto* r) { return kv.ReleaseLease(c, q, r); });
    case 21:
      return Unary<v1::OpenTransferRequest, v1::OpenTransferResponse>(
          data, size, "OpenTransfer",
          [&](auto* c, const auto& q, auto* r) { return kv.OpenTransfer(c, q, r); });
    case 22:
      return Unary<v1::SendLeaseRequest, v1::SendLeaseResponse>(
          data, size, "SendLease",
          [&](auto* c, const auto& q, auto* r) { return kv.SendLease(c, q, r); });
    case 23:
      return Unary<v1::CloseTransferRequest, v1::CloseTransferResponse>(
          data, size, "CloseTransfer",
          [&](auto* c, const auto& q, auto* r) { return kv.CloseTransfer(c, q, r); });
    case 24:
      return Unary<v1::ListLeasesRequest, v1::ListLeasesResponse>(
          data, size, "ListLeases",
          [&](auto* c, const auto& q, auto* r) { return admin.ListLeases(c, q, r); });
    case 25:
      return Unary<v1::EndLeaseRequest, v1::EndLeaseResponse>(
          data, size, "EndLease",
          [&](auto* c, const auto& q, auto* r) { return admin.EndLease(c, q, r); });
    default:
      return Unary<v1::GetServerInfoRequest, v1::ServerInfo>(
          data, size, "GetServerInfo",
          [&](auto* c, const auto& q, auto* r) { return admin.GetServerInfo(c, q, r); });
  }
}

constexpr int kRpcs = 27;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Harness& h = GetHarness();
  Seed(*h.server->store());
  Send(h, data[0] % kRpcs, data + 1, size - 1);
  Cleanup(h);
  return 0;
}
