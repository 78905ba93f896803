// An in-process kvcached on 127.0.0.1:0 plus a client connected to it.
#pragma once

#include <memory>

#include "cachesvc/server/server.h"
#include "kvc/client/kv_cache_client.h"
#include "tests/testing/pool_device.h"

namespace kvc::testing {

// A small pool: 4 layers x 2 kv heads (4 query heads) x head_dim 32, f16, 16 tokens/block.
inline cachesvc::ServerOptions SmallServerOptions(int64_t capacity_bytes = int64_t{64} << 20) {
  cachesvc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  cachesvc::PoolOptions pool;
  pool.device = TestPoolDevice();
  pool.name = "small";
  pool.capacity_bytes = capacity_bytes;
  pool.geometry.num_layers = 4;
  pool.geometry.num_kv_heads = 2;
  pool.geometry.num_query_heads = 4;
  pool.geometry.head_dim = 32;
  pool.geometry.block_tokens = 16;
  pool.geometry.dtype = kernels::DType::kF16;
  options.store.pools.push_back(pool);
  return options;
}

struct TestServer {
  std::unique_ptr<cachesvc::KvCacheServer> server;
  std::unique_ptr<client::KvCacheClient> client;
};

// Starts the server and connects a client; aborts the test binary on failure.
inline TestServer StartTestServer(const cachesvc::ServerOptions& options,
                                  client::ClientOptions client_options = {}) {
  TestServer t;
  auto server = cachesvc::KvCacheServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "cannot start test server: %s\n", server.status().ToString().c_str());
    std::abort();
  }
  t.server = std::move(*server);
  client_options.target = t.server->address();
  auto client = client::KvCacheClient::Connect(client_options);
  if (!client.ok()) std::abort();
  t.client = std::move(*client);
  return t;
}

}  // namespace kvc::testing
