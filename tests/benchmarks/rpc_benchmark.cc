// rpc_benchmark: Append and Fetch throughput of kvcached on loopback against two baselines
// measured in the same run — raw gRPC byte streaming with the same message size, and
// memcpy of the same bytes — so the ratios hold on a noisy machine. With --tls (default) it
// also runs a second kvcached serving TLS (certificates from tests/security/make_certs.sh
// in a temporary directory) and reports Append and Fetch over TLS against plaintext.
//
//   rpc_benchmark [--total_mib=256] [--chunk_kib=1024] [--rounds=5] [--tls] [--json=FILE]
//                 [--device=cpu|cuda:N] [--layers=1]
//
// --device puts the pool on a GPU (tests/gpu/run_service_gpu.sh): Append then stages each
// message through pinned memory to the device and quantizes there, Fetch reads on the device
// and copies back, against the same raw-gRPC and memcpy baselines.
//
// With a host pool it also measures the same-node path (a second client mapping the pool,
// and staged appends) and, for every pool, a third client that receives leased blocks over a
// transfer channel (docs/ARCHITECTURE.md "Transfers") as a reader on another node would.
//
// Each round runs every measurement once, in turn; the report gives the median over
// rounds. Not a test: it asserts nothing about speed.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cachesvc/server/server.h"
#include "kvc/client/kv_cache_client.h"
#include "raw_bytes.grpc.pb.h"

ABSL_FLAG(int32_t, total_mib, 256, "payload per measurement (keys + values)");
ABSL_FLAG(int32_t, chunk_kib, 1024, "payload per message (keys + values)");
ABSL_FLAG(int32_t, rounds, 5, "rounds; the median is reported");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");
ABSL_FLAG(bool, tls, true, "also measure Append and Fetch over TLS (needs openssl on PATH)");
ABSL_FLAG(std::string, make_certs, KVC_MAKE_CERTS_SCRIPT, "the script that makes the TLS certs");
ABSL_FLAG(std::string, device, "cpu", "the pool's device: cpu or cuda:N");
ABSL_FLAG(int32_t, block_tokens, 16, "the pool's tokens per block");
ABSL_FLAG(std::string, storage, "",
          "the sequences' storage format (int4_g64, fp8_e4m3, ...; empty = the pool's raw f16): "
          "the server quantizes each Append and every Fetch decodes");
ABSL_FLAG(int32_t, layers, 1,
          "layers of the pool; the appends go round-robin over them, as an engine's prefill "
          "does, and the fetches read every layer (--layers=32 --total_mib=4096: a 32K-token "
          "Llama-3-8B sequence)");

namespace {

namespace rb = ::kvcache::bench;
using Clock = std::chrono::steady_clock;

// The appended payload is f16 1.0 everywhere. Raw storage must return it bit for bit; a
// low-bit format returns it decoded, each element within 2% of 1.0.
kvc::client::StorageFormat g_storage = kvc::client::StorageFormat::kPoolDefault;

float HalfToFloat(uint16_t h) {  // normal and zero values (all this benchmark stores)
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return 0.0f;
  const float v = std::ldexp(1.0f + static_cast<float>(mant) / 1024.0f, static_cast<int>(exp) - 15);
  return (h & 0x8000) != 0 ? -v : v;
}

// The first 256 bytes at `got` are the payload's (see g_storage).
bool LooksAppended(const char* got, const std::string& keys) {
  if (g_storage == kvc::client::StorageFormat::kPoolDefault) {
    return std::memcmp(got, keys.data(), 256) == 0;
  }
  for (int i = 0; i < 128; ++i) {
    uint16_t h;
    std::memcpy(&h, got + 2 * i, 2);
    if (std::fabs(HalfToFloat(h) - 1.0f) > 0.02f) return false;
  }
  return true;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class RawBytesService final : public rb::RawBytes::Service {
 public:
  grpc::Status Upload(grpc::ServerContext*, grpc::ServerReader<rb::Blob>* reader,
                      rb::UploadSummary* summary) override {
    rb::Blob blob;
    int64_t bytes = 0;
    while (reader->Read(&blob)) bytes += static_cast<int64_t>(blob.data().size());
    summary->set_bytes(bytes);
    return grpc::Status::OK;
  }
  grpc::Status Download(grpc::ServerContext*, const rb::DownloadRequest* request,
                        grpc::ServerWriter<rb::Blob>* writer) override {
    rb::Blob blob;
    blob.mutable_data()->assign(static_cast<size_t>(request->message_bytes()), 'x');
    for (int64_t i = 0; i < request->messages(); ++i) {
      if (!writer->Write(blob)) break;
    }
    return grpc::Status::OK;
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A fresh directory holding make_certs.sh's certificates, or "" (reported) on failure.
std::string MakeCerts() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kvc-bench-certs-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) return "";
  const std::string command = absl::StrCat(absl::GetFlag(FLAGS_make_certs), " ", dir);
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "rpc_benchmark: '%s' failed; run with --notls\n", command.c_str());
    return "";
  }
  return dir;
}

// One AppendStream of `messages` chunks into a new sequence, then one Fetch of all of it;
// appends the seconds each took. False (reported) on any failure.
// Times one dense Fetch of the whole sequence through `client`; false (reported) unless every
// byte arrived and equals the pattern appended.
bool TimedFetch(kvc::client::KvCacheClient& client, const std::string& id, int64_t chunk_bytes,
                const std::string& keys, int64_t bytes, std::vector<double>* seconds) {
  kvc::client::FetchOptions fetch;
  fetch.max_chunk_bytes = chunk_bytes;
  int64_t got = 0;
  bool same = true;
  const auto t0 = Clock::now();
  const absl::Status st = client.FetchChunks(
      id, fetch,
      [&](kvc::client::FetchedChunk& c) {
        got += static_cast<int64_t>(c.keys.size() + c.values.size());
        // Every token's record is the same pattern: spot-check the first one of
        // the chunk.
        same = same && c.keys.size() >= 256 && LooksAppended(c.keys.data(), keys);
        return absl::OkStatus();
      },
      {});
  seconds->push_back(Seconds(t0, Clock::now()));
  if (!st.ok() || got != bytes || !same) {
    std::fprintf(stderr, "fetch failed: %s (%lld bytes, %s)\n", st.ToString().c_str(),
                 static_cast<long long>(got), same ? "same bytes" : "wrong bytes");
    return false;
  }
  return true;
}

// An engine's own KV buffers ([layer][heads][tokens][head_dim] f16 keys and values), allocated
// and touched once, filled by FetchInto every round.
struct EngineBuffers {
  int layers = 1, heads = 0, head_dim = 0;
  int64_t tokens = 0;  // per layer
  std::vector<char> keys, values;

  size_t LaneBytes() const {
    return static_cast<size_t>(tokens) * static_cast<size_t>(head_dim) * 2;
  }
};

// Times one FetchInto of the whole sequence into `engine`; false (reported) unless every lane
// got every token and its first record equals the pattern appended.
bool TimedFetchInto(kvc::client::KvCacheClient& client, const std::string& id,
                    const std::string& keys, EngineBuffers* engine, std::vector<double>* seconds) {
  kvc::client::FetchIntoOptions into;
  into.dtype = kvc::client::DType::kF16;
  into.num_kv_heads = engine->heads;
  into.head_dim = engine->head_dim;
  std::vector<kvc::client::LayerBuffers> buffers;
  const size_t layer_bytes = engine->LaneBytes() * static_cast<size_t>(engine->heads);
  for (int l = 0; l < engine->layers; ++l) {
    const size_t at = static_cast<size_t>(l) * layer_bytes;
    buffers.push_back({l, engine->keys.data() + at, engine->values.data() + at, engine->tokens});
  }
  const auto t0 = Clock::now();
  auto got = client.FetchInto(id, buffers, into, {});
  seconds->push_back(Seconds(t0, Clock::now()));
  bool full = got.ok() && got->lane_tokens.size() == static_cast<size_t>(engine->layers) *
                                                         static_cast<size_t>(engine->heads);
  for (size_t lane = 0; full && lane < got->lane_tokens.size(); ++lane) {
    full = got->lane_tokens[lane] == engine->tokens &&
           LooksAppended(engine->keys.data() + lane * engine->LaneBytes(), keys) &&
           LooksAppended(engine->values.data() + lane * engine->LaneBytes(), keys);
  }
  if (!full) {
    std::fprintf(stderr, "FetchInto failed: %s\n",
                 got.ok() ? "wrong bytes or tokens" : got.status().ToString().c_str());
    return false;
  }
  return true;
}

// One AppendStream of `messages` chunks into a new sequence (timed), message i to layer
// i % layers; its id, or "" (reported).
std::string TimedAppend(kvc::client::KvCacheClient& client, int64_t messages,
                        int tokens_per_message, const std::string& keys, const std::string& values,
                        std::vector<double>* seconds, int layers = 1) {
  kvc::client::CompressionSpec policy;
  policy.storage = g_storage;
  auto seq = client.CreateSequence({"bench", "", "", policy, {}});
  if (!seq.ok()) {
    std::fprintf(stderr, "create failed: %s\n", seq.status().ToString().c_str());
    return "";
  }
  const auto t0 = Clock::now();
  auto stream = client.StartAppendStream();
  for (int64_t i = 0; i < messages; ++i) {
    kvc::client::AppendChunk c;
    c.sequence_id = seq->sequence_id;
    c.layer = static_cast<int>(i % layers);
    c.start_position = i / layers * tokens_per_message;
    c.num_tokens = tokens_per_message;
    c.dtype = kvc::client::DType::kF16;
    c.keys = keys.data();
    c.values = values.data();
    c.bytes = keys.size();
    (void)stream->Write(c);
  }
  auto done = stream->Finish();
  seconds->push_back(Seconds(t0, Clock::now()));
  if (!done.ok()) {
    std::fprintf(stderr, "append failed: %s\n", done.status().ToString().c_str());
    return "";
  }
  return seq->sequence_id;
}

bool AppendThenFetch(kvc::client::KvCacheClient& client, int64_t messages, int tokens_per_message,
                     const std::string& keys, const std::string& values, int64_t bytes,
                     std::vector<double>* append_seconds, std::vector<double>* fetch_seconds,
                     kvc::client::KvCacheClient* local_client = nullptr,
                     std::vector<double>* local_seconds = nullptr, EngineBuffers* engine = nullptr,
                     std::vector<double>* into_seconds = nullptr, int layers = 1) {
  const std::string id =
      TimedAppend(client, messages, tokens_per_message, keys, values, append_seconds, layers);
  if (id.empty()) return false;
  // Dense fetch, same message size.
  const auto chunk_bytes = static_cast<int64_t>(keys.size() + values.size());
  if (!TimedFetch(client, id, chunk_bytes, keys, bytes, fetch_seconds)) return false;
  if (local_client != nullptr &&
      !TimedFetch(*local_client, id, chunk_bytes, keys, bytes, local_seconds)) {
    return false;
  }
  if (local_client != nullptr && engine != nullptr &&
      !TimedFetchInto(*local_client, id, keys, engine, into_seconds)) {
    return false;
  }
  (void)client.Release(id);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const std::string storage = absl::GetFlag(FLAGS_storage); !storage.empty()) {
    bool found = false;
    for (int f = 1; f <= static_cast<int>(kvc::client::StorageFormat::kNvfp4) && !found; ++f) {
      const auto format = static_cast<kvc::client::StorageFormat>(f);
      const char* name = kvc::client::StorageFormatName(format);
      if (name != nullptr && storage == name) {
        g_storage = format;
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "--storage=%s: not a storage format name (e.g. int4_g64)\n",
                   storage.c_str());
      return 1;
    }
  }
  const int64_t chunk = int64_t{absl::GetFlag(FLAGS_chunk_kib)} << 10;
  const int64_t total = int64_t{absl::GetFlag(FLAGS_total_mib)} << 20;
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int64_t messages = std::max<int64_t>(1, total / chunk);

  // A Llama-3-8B-like layer: 8 kv heads x head_dim 128, f16 = 2 KiB per token for keys.
  constexpr int kHeads = 8, kDim = 128;
  constexpr int64_t kTokenBytes = kHeads * kDim * 2;
  const int tokens_per_message = static_cast<int>(std::max<int64_t>(1, chunk / 2 / kTokenBytes));
  const int64_t payload_per_message = 2 * tokens_per_message * kTokenBytes;
  const int64_t bytes = messages * payload_per_message;

  kvc::cachesvc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  kvc::cachesvc::PoolOptions pool;
  pool.name = "bench";
  pool.device = absl::GetFlag(FLAGS_device);
  const int layers = std::max(1, absl::GetFlag(FLAGS_layers));
  if (messages % layers != 0) {
    std::fprintf(stderr, "%lld messages do not split evenly over %d layers: change --total_mib\n",
                 static_cast<long long>(messages), layers);
    return 1;
  }
  pool.geometry.num_layers = layers;
  pool.geometry.num_kv_heads = kHeads;
  pool.geometry.num_query_heads = 4 * kHeads;
  pool.geometry.head_dim = kDim;
  pool.geometry.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  pool.capacity_bytes = bytes + bytes / 8 + (int64_t{64} << 20);
  // Rounds reuse warm pages, as a server whose churn stays under keep_free_bytes does: what is
  // measured is the data path, not the OS handing out pages (~1 ms per MiB here).
  pool.keep_free_bytes = pool.capacity_bytes;
  options.store.pools.push_back(pool);
  options.max_message_bytes = 2 * chunk + (int64_t{1} << 20);
  // Same-node reads for the second client (host pools only).
  char socket_dir[] = "/tmp/kvc-rpcbench-XXXXXX";
  const bool host_pool = pool.device == "cpu";
  if (host_pool && mkdtemp(socket_dir) != nullptr) {
    options.local_socket = absl::StrCat(socket_dir, "/kvcached.sock");
    options.local_socket_allow_same_uid = true;  // the benchmark's clients run as this uid
  }
  // Transfer channels for the third client (a reader that cannot map the pool).
  options.transfer_listen = "127.0.0.1:0";
  auto server = kvc::cachesvc::KvCacheServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  kvc::client::ClientOptions client_options;
  client_options.target = (*server)->address();
  client_options.max_message_bytes = options.max_message_bytes;
  client_options.local_reads = false;  // the gRPC path
  client_options.transfers = false;
  auto client = kvc::client::KvCacheClient::Connect(client_options);
  kvc::client::ClientOptions transfer_options = client_options;
  transfer_options.transfers = true;
  auto transfer_client = *kvc::client::KvCacheClient::Connect(transfer_options);
  kvc::client::ClientOptions local_options = client_options;
  local_options.local_reads = true;
  std::unique_ptr<kvc::client::KvCacheClient> local_client;
  if (!options.local_socket.empty())
    local_client = *kvc::client::KvCacheClient::Connect(local_options);

  // The same kvcached over TLS (server certificate only, as most deployments start).
  const bool tls = absl::GetFlag(FLAGS_tls) && absl::GetFlag(FLAGS_layers) <= 1;
  std::unique_ptr<kvc::cachesvc::KvCacheServer> tls_server;
  std::unique_ptr<kvc::client::KvCacheClient> tls_client;
  std::unique_ptr<kvc::client::KvCacheClient> tls_transfer_client;
  std::string certs;
  if (tls) {
    certs = MakeCerts();
    if (certs.empty()) return 1;
    kvc::cachesvc::ServerOptions tls_options = options;
    tls_options.tls.cert_file = certs + "/server.pem";
    tls_options.tls.key_file = certs + "/server.key";
    tls_options.local_socket.clear();  // the path is the first server's
    // Its transfer listener speaks TLS too (the same certificate).
    auto started = kvc::cachesvc::KvCacheServer::Start(tls_options);
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
      return 1;
    }
    tls_server = *std::move(started);
    kvc::client::ClientOptions tls_client_options = client_options;
    tls_client_options.target = tls_server->address();
    tls_client_options.tls.ca_file = certs + "/ca.pem";
    auto connected = kvc::client::KvCacheClient::Connect(tls_client_options);
    if (!connected.ok()) {
      std::fprintf(stderr, "%s\n", connected.status().ToString().c_str());
      return 1;
    }
    tls_client = *std::move(connected);
    tls_client_options.transfers = true;
    tls_client_options.local_reads = false;
    tls_transfer_client = *kvc::client::KvCacheClient::Connect(tls_client_options);
  }

  RawBytesService raw_service;
  grpc::ServerBuilder builder;
  int raw_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &raw_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(&raw_service);
  auto raw_server = builder.BuildAndStart();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  auto raw_stub = rb::RawBytes::NewStub(grpc::CreateCustomChannel(
      absl::StrFormat("127.0.0.1:%d", raw_port), grpc::InsecureChannelCredentials(), args));

  std::string keys(static_cast<size_t>(tokens_per_message * kTokenBytes), '\0');
  for (size_t i = 0; i < keys.size(); i += 2) keys[i + 1] = 0x3c;  // f16 1.0-ish values
  std::string values = keys;
  // memcpy runs at the same speed on 1 GiB as on more (far past every cache): larger
  // measurements copy 1 GiB and report its rate, which keeps a 4 GiB run in memory.
  const size_t memcpy_bytes = static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30));
  std::vector<char> src(memcpy_bytes, 1), dst(memcpy_bytes, 0);

  std::vector<double> t_raw_up, t_raw_down, t_append, t_fetch, t_memcpy;
  std::vector<double> t_tls_append, t_tls_fetch, t_local_fetch, t_local_into, t_local_append;
  std::vector<double> t_transfer_fetch, t_transfer_into, t_tls_transfer_into;
  EngineBuffers engine;
  engine.layers = layers;
  engine.heads = kHeads;
  engine.head_dim = kDim;
  engine.tokens = messages / layers * tokens_per_message;
  engine.keys.assign(static_cast<size_t>(bytes / 2), 1);
  engine.values.assign(static_cast<size_t>(bytes / 2), 1);
  for (int r = 0; r < rounds; ++r) {
    {  // raw upload
      rb::Blob blob;
      blob.mutable_data()->assign(static_cast<size_t>(payload_per_message), 'x');
      grpc::ClientContext ctx;
      rb::UploadSummary summary;
      const auto t0 = Clock::now();
      auto writer = raw_stub->Upload(&ctx, &summary);
      // Copy the payload into the message for every write, as kvcache's client copies each
      // chunk into its (reused) request; the baseline reuses its message the same way.
      rb::Blob m;
      for (int64_t i = 0; i < messages; ++i) {
        m.mutable_data()->assign(blob.data());
        writer->Write(m);
      }
      writer->WritesDone();
      const grpc::Status st = writer->Finish();
      t_raw_up.push_back(Seconds(t0, Clock::now()));
      if (!st.ok() || summary.bytes() != bytes) {
        std::fprintf(stderr, "raw upload failed: %s\n", st.error_message().c_str());
        return 1;
      }
    }
    if (!AppendThenFetch(**client, messages, tokens_per_message, keys, values, bytes, &t_append,
                         &t_fetch, local_client.get(), &t_local_fetch, &engine, &t_local_into,
                         layers)) {
      return 1;
    }
    {  // Fetch and FetchInto over a transfer channel, of a sequence appended over gRPC
      std::vector<double> unused;
      const std::string id =
          TimedAppend(**client, messages, tokens_per_message, keys, values, &unused, layers);
      if (id.empty() ||
          !TimedFetch(*transfer_client, id, static_cast<int64_t>(2 * keys.size()), keys, bytes,
                      &t_transfer_fetch) ||
          !TimedFetchInto(*transfer_client, id, keys, &engine, &t_transfer_into)) {
        return 1;
      }
      (void)(*client)->Release(id);
    }
    if (local_client != nullptr) {  // AppendStream through the staging region
      const std::string id = TimedAppend(*local_client, messages, tokens_per_message, keys, values,
                                         &t_local_append, layers);
      std::vector<double> unused;
      if (id.empty() ||
          !TimedFetch(**client, id, static_cast<int64_t>(2 * keys.size()), keys, bytes, &unused)) {
        return 1;
      }
      (void)local_client->Release(id);
    }
    if (tls && !AppendThenFetch(*tls_client, messages, tokens_per_message, keys, values, bytes,
                                &t_tls_append, &t_tls_fetch)) {
      return 1;
    }
    if (tls) {  // FetchInto over the TLS server's transfer channel (TLS, frames with MACs)
      std::vector<double> unused;
      const std::string id =
          TimedAppend(*tls_client, messages, tokens_per_message, keys, values, &unused, layers);
      if (id.empty() ||
          !TimedFetchInto(*tls_transfer_client, id, keys, &engine, &t_tls_transfer_into)) {
        return 1;
      }
      (void)tls_client->Release(id);
    }
    {  // raw download
      rb::DownloadRequest req;
      req.set_messages(messages);
      req.set_message_bytes(payload_per_message);
      grpc::ClientContext ctx;
      const auto t0 = Clock::now();
      auto reader = raw_stub->Download(&ctx, req);
      rb::Blob blob;
      int64_t got = 0;
      while (reader->Read(&blob)) got += static_cast<int64_t>(blob.data().size());
      const grpc::Status st = reader->Finish();
      t_raw_down.push_back(Seconds(t0, Clock::now()));
      if (!st.ok() || got != bytes) return 1;
    }
    {  // memcpy of the same bytes
      const auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), src.size());
      t_memcpy.push_back(Seconds(t0, Clock::now()));
      src[static_cast<size_t>(r)] = dst[static_cast<size_t>(r) + 1];  // keep the copy live
    }
  }

  const double gb = static_cast<double>(bytes) / 1e9;
  const double raw_up = gb / Median(t_raw_up), raw_down = gb / Median(t_raw_down);
  const bool fetched = !t_fetch.empty();
  const double append = gb / Median(t_append), fetch = fetched ? gb / Median(t_fetch) : 0;
  const double memcpy_gbs = static_cast<double>(memcpy_bytes) / 1e9 / Median(t_memcpy);
  std::printf(
      "rpc_benchmark: %lld messages x %lld bytes = %.1f MiB per measurement over %d layer(s), "
      "%d rounds (median), 127.0.0.1 TCP\n",
      static_cast<long long>(messages), static_cast<long long>(payload_per_message),
      static_cast<double>(bytes) / 1048576.0, layers, rounds);
  std::printf("%-34s %10s %14s %12s\n", "measurement", "GB/s", "vs raw gRPC", "vs memcpy");
  std::printf("%-34s %10.3f %14s %12.3f\n", "memcpy", memcpy_gbs, "", 1.0);
  std::printf("%-34s %10.3f %14.3f %12.3f\n", "raw gRPC client-stream (upload)", raw_up, 1.0,
              raw_up / memcpy_gbs);
  std::printf("%-34s %10.3f %14.3f %12.3f\n", "kvcache AppendStream", append, append / raw_up,
              append / memcpy_gbs);
  double local_fetch = 0, local_into = 0, local_append = 0;
  if (local_client != nullptr) {
    local_append = gb / Median(t_local_append);
    std::printf("%-34s %10.3f %14.3f %12.3f  (%s)\n", "kvcache AppendStream, staged", local_append,
                local_append / raw_up, local_append / memcpy_gbs,
                local_client->AppendPath().c_str());
  }
  std::printf("%-34s %10.3f %14.3f %12.3f\n", "raw gRPC server-stream (download)", raw_down, 1.0,
              raw_down / memcpy_gbs);
  if (fetched) {
    std::printf("%-34s %10.3f %14.3f %12.3f\n", "kvcache Fetch (dense f16)", fetch,
                fetch / raw_down, fetch / memcpy_gbs);
  }
  if (local_client != nullptr && fetched) {
    local_fetch = gb / Median(t_local_fetch);
    std::printf("%-34s %10.3f %14.3f %12.3f  (%s)\n", "kvcache Fetch, same-node mapping",
                local_fetch, local_fetch / raw_down, local_fetch / memcpy_gbs,
                local_client->DataPath().c_str());
    local_into = gb / Median(t_local_into);
    std::printf("%-34s %10.3f %14.3f %12.3f\n", "kvcache FetchInto, same-node", local_into,
                local_into / raw_down, local_into / memcpy_gbs);
  }
  const double transfer_fetch = gb / Median(t_transfer_fetch);
  const double transfer_into = gb / Median(t_transfer_into);
  std::printf("%-34s %10.3f %14.3f %12.3f  (%s)\n", "kvcache Fetch, transfer channel",
              transfer_fetch, transfer_fetch / raw_down, transfer_fetch / memcpy_gbs,
              transfer_client->DataPath().c_str());
  std::printf("%-34s %10.3f %14.3f %12.3f\n", "kvcache FetchInto, transfer", transfer_into,
              transfer_into / raw_down, transfer_into / memcpy_gbs);
  double tls_append = 0, tls_fetch = 0;
  if (tls) {
    tls_append = gb / Median(t_tls_append);
    tls_fetch = gb / Median(t_tls_fetch);
    std::printf("%-34s %10s %14s\n", "over TLS (server certificate)", "GB/s", "vs plaintext");
    std::printf("%-34s %10.3f %14.3f\n", "kvcache AppendStream, TLS", tls_append,
                tls_append / append);
    std::printf("%-34s %10.3f %14.3f\n", "kvcache Fetch (dense f16), TLS", tls_fetch,
                tls_fetch / fetch);
    const double tls_into = gb / Median(t_tls_transfer_into);
    std::printf("%-34s %10.3f %14.3f  (%s)\n", "kvcache FetchInto, transfer, TLS", tls_into,
                tls_into / transfer_into, tls_transfer_client->DataPath().c_str());
  }
  const std::string json_path = absl::GetFlag(FLAGS_json);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << absl::StrFormat(
        "{\"bytes\": %lld, \"message_bytes\": %lld, \"rounds\": %d, \"memcpy_gbps\": %.4f, "
        "\"raw_upload_gbps\": %.4f, \"append_gbps\": %.4f, \"append_vs_raw\": %.4f, "
        "\"raw_download_gbps\": %.4f, \"fetch_gbps\": %.4f, \"fetch_vs_raw\": %.4f, "
        "\"tls_append_gbps\": %.4f, \"tls_append_vs_plaintext\": %.4f, "
        "\"tls_fetch_gbps\": %.4f, \"tls_fetch_vs_plaintext\": %.4f, "
        "\"local_fetch_gbps\": %.4f, \"local_fetch_vs_memcpy\": %.4f, "
        "\"local_fetch_into_gbps\": %.4f, \"local_fetch_into_vs_memcpy\": %.4f, "
        "\"local_append_gbps\": %.4f, \"local_append_vs_memcpy\": %.4f, "
        "\"transfer_fetch_gbps\": %.4f, \"transfer_fetch_into_gbps\": %.4f}\n",
        static_cast<long long>(bytes), static_cast<long long>(payload_per_message), rounds,
        memcpy_gbs, raw_up, append, append / raw_up, raw_down, fetch, fetch / raw_down, tls_append,
        tls ? tls_append / append : 0.0, tls_fetch, tls ? tls_fetch / fetch : 0.0, local_fetch,
        local_fetch / memcpy_gbs, local_into, local_into / memcpy_gbs, local_append,
        local_append / memcpy_gbs, transfer_fetch, transfer_into);
  }
  raw_server->Shutdown();
  local_client.reset();
  transfer_client.reset();
  server->reset();  // removes its socket file
  if (!options.local_socket.empty()) std::filesystem::remove_all(socket_dir);
  if (!certs.empty()) (void)std::system(absl::StrCat("rm -rf ", certs).c_str());
  return 0;
}
