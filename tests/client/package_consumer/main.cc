// Uses only the installed public API: connect, create, append every layer, fetch, check,
// release. usage: consumer host:port
#include <cstdio>
#include <string>
#include <vector>

#include "kvc/client/admin_client.h"
#include "kvc/client/kv_cache_client.h"
#ifdef KVC_CONSUMER_DEVICE
#include "kvc/client/device_reader.h"
#endif

int main(int argc, char** argv) {
  if (argc != 2) return 64;
  kvc::client::ClientOptions options;
  options.target = argv[1];
  auto client = kvc::client::KvCacheClient::Connect(options);
  if (!client.ok()) return 1;
  auto pools = kvc::client::AdminClient::Over(**client).ListPools();
  if (!pools.ok()) {
    std::fprintf(stderr, "ListPools: %s\n", pools.status().ToString().c_str());
    return 1;
  }
  const auto& g = pools->front().geometry;
  auto seq = (*client)->CreateSequence({});
  if (!seq.ok()) return 1;
  const int n = 8;
  std::vector<float> keys(static_cast<size_t>(n) * g.num_kv_heads * g.head_dim);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<float>(i % 64) / 4.0f;
  for (int layer = 0; layer < g.num_layers; ++layer) {
    kvc::client::AppendChunk chunk;
    chunk.sequence_id = seq->sequence_id;
    chunk.layer = layer;
    chunk.num_tokens = n;
    chunk.dtype = kvc::client::DType::kF32;
    chunk.keys = keys.data();
    chunk.values = keys.data();
    chunk.bytes = keys.size() * sizeof(float);
    auto r = (*client)->Append(chunk);
    if (!r.ok()) {
      std::fprintf(stderr, "Append: %s\n", r.status().ToString().c_str());
      return 1;
    }
  }
  kvc::client::FetchOptions fetch;
  fetch.dtype = kvc::client::DType::kF32;
  fetch.layers = {g.num_layers - 1};
  auto kv = (*client)->Fetch(seq->sequence_id, fetch);
  if (!kv.ok() || kv->visible_tokens != n || kv->heads.empty()) return 1;
  const float* got = reinterpret_cast<const float*>(kv->heads[0].keys.data());
  for (int t = 0; t < n; ++t) {
    for (int e = 0; e < g.head_dim; ++e) {
      if (got[t * g.head_dim + e] !=
          keys[(static_cast<size_t>(t) * g.num_kv_heads) * g.head_dim + e]) {
        std::fprintf(stderr, "mismatch at token %d element %d\n", t, e);
        return 1;
      }
    }
  }
#ifdef KVC_CONSUMER_DEVICE
  // The device reader links and runs from the package: without a CUDA backend it says so;
  // with one, a sequence of a host pool is refused before anything is read.
  auto device = kvc::client::DeviceReader::Create(client->get());
  if (device.ok()) {
    std::vector<float> out(keys.size());
    kvc::client::FetchIntoOptions into;
    into.dtype = kvc::client::DType::kF32;
    into.num_kv_heads = g.num_kv_heads;
    into.head_dim = g.head_dim;
    auto read = (*device)->FetchInto(seq->sequence_id, {{0, out.data(), out.data(), n}}, into);
    if (read.status().code() != absl::StatusCode::kFailedPrecondition) {
      std::fprintf(stderr, "DeviceReader::FetchInto of a host pool: %s\n",
                   read.status().ToString().c_str());
      return 1;
    }
    std::printf("consumer: device reader refuses a host pool: %s\n",
                std::string(read.status().message()).c_str());
  } else if (device.status().code() != absl::StatusCode::kUnavailable) {
    std::fprintf(stderr, "DeviceReader::Create: %s\n", device.status().ToString().c_str());
    return 1;
  } else {
    std::printf("consumer: %s\n", std::string(device.status().message()).c_str());
  }
#endif
  if (!(*client)->Release(seq->sequence_id).ok()) return 1;
  std::printf("consumer: OK (%d layers, %d tokens)\n", g.num_layers, n);
  return 0;
}
