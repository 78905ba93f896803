// A client that the fault tests SIGKILL in the middle of a call. It prints one line when
// the call is under way, then keeps the call busy until it is killed:
//   fault_client append TARGET SEQUENCE   AppendStream of deterministic KV, layer by layer,
//                                         kChunk tokens a message, never finished
//   fault_client fetch TARGET SEQUENCE    Fetch in the smallest chunks, read slowly
//   fault_client lease TARGET SEQUENCE    LeaseSequence with a 1 s TTL, renewed every
//                                         100 ms (a reader that dies leaves its last TTL)
// Geometry and payloads are shared with the test through fault_geometry.h.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "kvcache/v1/kvcache_service.grpc.pb.h"
#include "tests/faults/fault_geometry.h"

namespace {

namespace pb = ::kvcache::v1;
using kvc::faults::AppendMessage;
using kvc::faults::kChunk;
using kvc::faults::kLayers;

void Say(const char* line) {
  std::printf("%s\n", line);
  std::fflush(stdout);
}

int RunAppend(pb::KvCacheService::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  pb::AppendStreamResponse response;
  auto writer = stub.AppendStream(&context, &response);
  int written = 0;
  // Round-robin over layers so a kill leaves layers of different lengths.
  for (int64_t start = 0;; start += kChunk) {
    for (int layer = 0; layer < kLayers; ++layer) {
      if (!writer->Write(AppendMessage(id, layer, start))) {
        std::fprintf(stderr, "stream ended: %s\n", writer->Finish().error_message().c_str());
        return 1;
      }
      if (++written == 4) Say("streaming");
    }
  }
}

int RunFetch(pb::KvCacheService::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  pb::FetchRequest request;
  request.set_sequence_id(id);
  request.set_max_chunk_bytes(4096);  // clamped to the smallest chunk: many messages
  auto reader = stub.Fetch(&context, request);
  pb::FetchChunk chunk;
  bool said = false;
  while (reader->Read(&chunk)) {
    if (!said) Say("fetching");
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the server waits on us
  }
  std::fprintf(stderr, "fetch ended: %s\n", reader->Finish().error_message().c_str());
  return 1;
}

int RunLease(pb::KvCacheService::Stub& stub, const std::string& id) {
  pb::LeaseRequest request;
  request.set_sequence_id(id);
  request.set_ttl_ms(1000);
  pb::Lease lease;
  {
    grpc::ClientContext context;
    const grpc::Status s = stub.LeaseSequence(&context, request, &lease);
    if (!s.ok()) {
      std::fprintf(stderr, "lease refused: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  Say("leased");
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pb::RenewLeaseRequest renew;
    renew.set_lease_id(lease.lease_id());
    renew.set_ttl_ms(1000);
    pb::RenewLeaseResponse renewed;
    grpc::ClientContext context;
    const grpc::Status s = stub.RenewLease(&context, renew, &renewed);
    if (!s.ok()) {
      std::fprintf(stderr, "renew refused: %s\n", s.error_message().c_str());
      return 1;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fault_client append|fetch|lease TARGET SEQUENCE\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto stub =
      pb::KvCacheService::NewStub(grpc::CreateChannel(argv[2], grpc::InsecureChannelCredentials()));
  if (mode == "append") return RunAppend(*stub, argv[3]);
  if (mode == "fetch") return RunFetch(*stub, argv[3]);
  if (mode == "lease") return RunLease(*stub, argv[3]);
  std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
  return 2;
}
