// prefix_benchmark: what the prefix cache saves an engine, through a real kvcached on
// loopback. A document of --tokens tokens (SmolLM2-135M's KV shape by default: 30 layers x
// 3 kv heads x head_dim 64, f16) is prefilled once with AppendStream and published; then
// each round measures, against that baseline measured in the same run:
//   append   prefilling the document into a new sequence again (AppendStream, every layer)
//   attach   CreateSequence with the document's token ids (lookup, verify every block's
//            checksum, share the blocks)
//   lookup   LookupPrefix of the same ids (hash the ids, probe the index)
//   memcpy   copying the document's bytes once (the floor of any copy-based reuse)
// and then --sharers sequences attached at once: pool bytes vs one copy.
//
//   prefix_benchmark [--tokens=32768] [--layers=30] [--kv_heads=3] [--head_dim=64]
//                    [--rounds=5] [--sharers=8] [--json=FILE]
//
// The report gives the median over rounds. Not a test: it asserts nothing about speed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "cachesvc/server/server.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/kv_cache_client.h"

ABSL_FLAG(int32_t, tokens, 32768, "document length in tokens");
ABSL_FLAG(int32_t, layers, 30, "layers");
ABSL_FLAG(int32_t, kv_heads, 3, "kv heads");
ABSL_FLAG(int32_t, head_dim, 64, "head dim");
ABSL_FLAG(int32_t, rounds, 5, "rounds; the median is reported");
ABSL_FLAG(int32_t, sharers, 8, "sequences attached at once for the pool-bytes figure");
ABSL_FLAG(std::string, json, "", "also write the results as JSON to this file");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s failed: %s\n", what, status.ToString().c_str());
  return 1;
}

// Prefills `tokens` tokens of every layer in messages of <= 1 MiB of keys.
absl::Status Prefill(kvc::client::KvCacheClient& client, const std::string& id, int layers,
                     int tokens, int per_message, const std::string& keys) {
  auto stream = client.StartAppendStream();
  for (int start = 0; start < tokens; start += per_message) {
    const int n = std::min(per_message, tokens - start);
    for (int l = 0; l < layers; ++l) {
      kvc::client::AppendChunk c;
      c.sequence_id = id;
      c.layer = l;
      c.start_position = start;
      c.num_tokens = n;
      c.dtype = kvc::client::DType::kF16;
      c.keys = keys.data();
      c.values = keys.data();
      c.bytes = keys.size() / static_cast<size_t>(per_message) * static_cast<size_t>(n);
      if (!stream->Write(c).ok()) break;
    }
  }
  return stream->Finish().status();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int tokens = absl::GetFlag(FLAGS_tokens), layers = absl::GetFlag(FLAGS_layers);
  const int heads = absl::GetFlag(FLAGS_kv_heads), dim = absl::GetFlag(FLAGS_head_dim);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int sharers = std::max(1, absl::GetFlag(FLAGS_sharers));
  const int64_t token_layer_bytes = int64_t{heads} * dim * 2;  // keys, f16
  const int64_t doc_bytes = 2 * token_layer_bytes * layers * tokens;
  const int per_message =
      static_cast<int>(std::max<int64_t>(1, (int64_t{1} << 20) / token_layer_bytes));

  kvc::cachesvc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  kvc::cachesvc::PoolOptions pool;
  pool.name = "bench";
  pool.geometry.num_layers = layers;
  pool.geometry.num_kv_heads = heads;
  pool.geometry.num_query_heads = 3 * heads;
  pool.geometry.head_dim = dim;
  // The published document, one re-append at a time, and slack.
  pool.capacity_bytes = 2 * doc_bytes + doc_bytes / 4 + (int64_t{64} << 20);
  // Rounds reuse warm pages, as a server whose churn stays under keep_free_bytes does: what is
  // measured is the data path, not the OS handing out pages (~1 ms per MiB here).
  pool.keep_free_bytes = pool.capacity_bytes;
  options.store.pools.push_back(pool);
  options.max_message_bytes = (int64_t{3} << 20);
  auto server = kvc::cachesvc::KvCacheServer::Start(options);
  if (!server.ok()) return Fail("starting kvcached", server.status());
  kvc::client::ClientOptions client_options;
  client_options.target = (*server)->address();
  client_options.max_message_bytes = options.max_message_bytes;
  auto connected = kvc::client::KvCacheClient::Connect(client_options);
  if (!connected.ok()) return Fail("connecting", connected.status());
  kvc::client::KvCacheClient& client = **connected;

  std::string keys(static_cast<size_t>(per_message * token_layer_bytes), '\0');
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<char>((i * 131) >> 3);
  kvc::client::Prefix doc{"bench-model", "", std::vector<int32_t>(static_cast<size_t>(tokens))};
  std::iota(doc.token_ids.begin(), doc.token_ids.end(), 7);

  // The published original.
  auto original = client.CreateSequence({"bench", "", "", {}, {}});
  if (!original.ok()) return Fail("create", original.status());
  if (auto s = Prefill(client, original->sequence_id, layers, tokens, per_message, keys); !s.ok())
    return Fail("prefill", s);
  auto t_publish = Clock::now();
  auto published = client.PublishPrefix(original->sequence_id, doc);
  const double publish_s = Seconds(t_publish);
  if (!published.ok()) return Fail("publish", published.status());

  std::vector<double> append_s, attach_s, lookup_s, memcpy_s;
  std::vector<char> src(static_cast<size_t>(doc_bytes)), dst(static_cast<size_t>(doc_bytes));
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  int64_t attached = 0;
  for (int r = 0; r < rounds; ++r) {
    auto again = client.CreateSequence({"bench", "", "", {}, {}});
    if (!again.ok()) return Fail("create", again.status());
    auto t0 = Clock::now();
    if (auto s = Prefill(client, again->sequence_id, layers, tokens, per_message, keys); !s.ok())
      return Fail("prefill again", s);
    append_s.push_back(Seconds(t0));
    (void)client.Release(again->sequence_id);

    kvc::client::CreateSequenceOptions with_prefix;
    with_prefix.pool = "bench";
    with_prefix.prefix = doc;
    t0 = Clock::now();
    auto sharer = client.CreateSequence(with_prefix);
    attach_s.push_back(Seconds(t0));
    if (!sharer.ok()) return Fail("attach", sharer.status());
    attached = sharer->attached_tokens;
    (void)client.Release(sharer->sequence_id);

    t0 = Clock::now();
    auto cached = client.LookupPrefix("bench", doc);
    lookup_s.push_back(Seconds(t0));
    if (!cached.ok()) return Fail("lookup", cached.status());

    t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    memcpy_s.push_back(Seconds(t0));
  }

  // Pool bytes for `sharers` sequences on one document.
  const int64_t used_one = kvc::client::AdminClient::Over(client).GetPoolStats("bench")->used_bytes;
  std::vector<std::string> ids;
  for (int i = 0; i < sharers; ++i) {
    kvc::client::CreateSequenceOptions with_prefix;
    with_prefix.pool = "bench";
    with_prefix.prefix = doc;
    auto s = client.CreateSequence(with_prefix);
    if (!s.ok()) return Fail("attach", s.status());
    ids.push_back(s->sequence_id);
  }
  const int64_t used_shared =
      kvc::client::AdminClient::Over(client).GetPoolStats("bench")->used_bytes;

  const double append = Median(append_s), attach = Median(attach_s), lookup = Median(lookup_s),
               copy = Median(memcpy_s);
  std::printf("document: %d tokens, %d layers x %d kv heads x %d dims f16 = %.1f MiB of K+V\n",
              tokens, layers, heads, dim, static_cast<double>(doc_bytes) / (1 << 20));
  std::printf("publish once        %9.2f ms (%lld tokens cached)\n", publish_s * 1e3,
              static_cast<long long>(published->published_tokens));
  std::printf("append again        %9.2f ms  (baseline)\n", append * 1e3);
  std::printf("attach (verified)   %9.2f ms  %7.1fx faster than appending (%lld tokens)\n",
              attach * 1e3, append / attach, static_cast<long long>(attached));
  std::printf("lookup              %9.3f ms  %7.1fx faster than appending\n", lookup * 1e3,
              append / lookup);
  std::printf("memcpy of the bytes %9.2f ms  %7.1fx faster than appending\n", copy * 1e3,
              append / copy);
  std::printf("pool bytes, 1 + %d sharers: %.1f MiB (one copy: %.1f MiB; %.3fx of one copy)\n",
              sharers, static_cast<double>(used_shared) / (1 << 20),
              static_cast<double>(used_one) / (1 << 20),
              static_cast<double>(used_shared) / static_cast<double>(used_one));
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << absl::StrFormat(
        "{\"tokens\":%d,\"layers\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"doc_bytes\":%d,"
        "\"publish_s\":%.6f,\"append_s\":%.6f,\"attach_s\":%.6f,\"lookup_s\":%.6f,"
        "\"memcpy_s\":%.6f,\"attached_tokens\":%d,\"sharers\":%d,\"used_one\":%d,"
        "\"used_shared\":%d}\n",
        tokens, layers, heads, dim, doc_bytes, publish_s, append, attach, lookup, copy, attached,
        sharers, used_one, used_shared);
  }
  for (const std::string& id : ids) (void)client.Release(id);
  return attached == tokens / 16 * 16 ? 0 : 1;
}
