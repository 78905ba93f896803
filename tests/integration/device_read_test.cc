// Same-node reads of a DEVICE pool through CUDA IPC (kvc/client/device_reader.h), two real
// processes: kvcached with a cuda:0 pool and a local_socket, and this test as the engine. The
// reader opens the pool's IPC handle once and decodes leased records on the device into the
// engine's device buffers: every byte (and every untouched row) equals what FetchInto over
// gRPC writes into host buffers, for raw f16 and INT4 with a raw residual window (two
// formats), dense f16 and f32, a layer subset and an unfinished layer; PoolBase plus the
// lease locate a stored record exactly; after a server restart only the new server's pool is
// read; host pools, small buffers, bad shapes and a client without the same-node path are
// refused with the right codes, nothing written; every lease ends. Runs on cudasim in CI (its IPC
// maps the exporter's memfd across processes) and on a real GPU in tests/gpu/run_service_gpu.sh.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/transfer_rpcs.h"
#include "gtest/gtest.h"
#include "kvc/client/admin_client.h"
#include "kvc/client/device_reader.h"
#include "kvc/client/kv_cache_client.h"
#include "kvc/kernels/backend.h"
#include "tests/testing/kv_data.h"
#include "tests/testing/kvcached_process.h"

namespace kvc {
namespace {

using client::DType;
using client::StorageFormat;
using ::kvc::testing::MakeKv;
constexpr int kLayers = 4, kHeads = 2, kDim = 64, kCapacity = 160;
constexpr unsigned char kUntouched = 0xAB;

// The kvcached to start: this build's, or KVC_KVCACHED (the GPU bundle's copy elsewhere).
std::string KvcachedPath() {
  const char* env = std::getenv("KVC_KVCACHED");
  return env != nullptr && *env != '\0' ? env : KVCACHED_PATH;
}

std::string Config(const std::string& dir) {
  return absl::StrCat(
      "local_socket: '", dir, "/kvcached.sock'\nlocal_socket_allow_same_uid: true\n",
      "pools { name: 'gpu' device: 'cuda:0' capacity_bytes: 33554432 geometry { num_layers: ",
      kLayers, " num_kv_heads: ", kHeads, " num_query_heads: 4 head_dim: ", kDim,
      " block_tokens: 16 dtype: DTYPE_F16 } }\n",
      "pools { name: 'host' capacity_bytes: 16777216 geometry { num_layers: ", kLayers,
      " num_kv_heads: ", kHeads, " num_query_heads: 4 head_dim: ", kDim,
      " block_tokens: 16 dtype: DTYPE_F16 } }\n");
}

class DeviceReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const kernels::KernelStatus ks =
        kernels::CreateBackend(kernels::BackendKind::kCuda, {}, &device_);
    if (!ks.ok()) GTEST_SKIP() << "no CUDA device in this process: " << ks.detail;
    char tmpl[] = "/tmp/kvc-device-read-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/kvcached.conf") << Config(dir_);
    server_ = std::make_unique<testing::KvcachedProcess>(
        KvcachedPath(), dir_,
        std::vector<std::string>{"--config=" + dir_ + "/kvcached.conf", "--listen=127.0.0.1:0",
                                 "--metrics_listen=off"});
    ASSERT_FALSE(server_->target().empty()) << server_->Log();
    client::ClientOptions o;
    o.target = server_->target();
    auto c = client::KvCacheClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    auto r = client::DeviceReader::Create(client_.get());
    ASSERT_TRUE(r.ok()) << r.status();
    reader_ = *std::move(r);
  }
  void TearDown() override {
    if (HasFailure() && server_ != nullptr) std::fprintf(stderr, "%s\n", server_->Log().c_str());
    reader_.reset();  // closes the pool's mapping before the server goes
    client_.reset();
    server_.reset();
    for (void* p : allocations_) device_->Free(p);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A sequence in `pool` with `n` tokens of data `seed` in every layer (and `extra` more in
  // layer 0 only).
  std::string Filled(const std::string& pool, int n, const client::CompressionSpec& policy = {},
                     int extra = 0, uint32_t seed = 9) {
    client::CreateSequenceOptions options;
    options.pool = pool;
    options.policy = policy;
    auto s = client_->CreateSequence(options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return "";
    for (int l = 0; l < kLayers; ++l) {
      const int count = n + (l == 0 ? extra : 0);
      const std::string k = MakeKv(seed, l, 0, count, kHeads, kDim, kernels::DType::kF16,
                                   /*is_value=*/false);
      const std::string v = MakeKv(seed, l, 0, count, kHeads, kDim, kernels::DType::kF16,
                                   /*is_value=*/true);
      client::AppendChunk a;
      a.sequence_id = s->sequence_id;
      a.layer = l;
      a.num_tokens = count;
      a.dtype = DType::kF16;
      a.keys = k.data();
      a.values = v.data();
      a.bytes = k.size();
      auto r = client_->Append(a);
      EXPECT_TRUE(r.ok()) << r.status();
    }
    return s->sequence_id;
  }

  void* DeviceBuffer(size_t bytes) {
    void* p = nullptr;
    EXPECT_TRUE(device_->Allocate(bytes, &p).ok());
    allocations_.push_back(p);
    EXPECT_TRUE(device_->Memset(p, kUntouched, bytes, {}).ok());
    EXPECT_TRUE(device_->Synchronize({}).ok());
    return p;
  }
  std::string ToHost(const void* p, size_t bytes) {
    std::string out(bytes, '\0');
    EXPECT_TRUE(device_->CopyToHost(out.data(), p, bytes, {}).ok());
    EXPECT_TRUE(device_->Synchronize({}).ok());
    return out;
  }

  // Reads `layers` both ways (device buffers through the reader, host buffers over gRPC)
  // and expects the same bytes, results and untouched rows.
  void ExpectSameAsGrpc(const std::string& seq, const std::vector<int32_t>& layers, DType dtype,
                        bool include_unfinished) {
    SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " layers "
                                      << layers.size() << " unfinished " << include_unfinished);
    const size_t bytes = size_t{kHeads} * kCapacity * kDim * (dtype == DType::kF32 ? 4 : 2);
    client::FetchIntoOptions options;
    options.dtype = dtype;
    options.num_kv_heads = kHeads;
    options.head_dim = kDim;
    options.include_unfinished = include_unfinished;
    options.positions = true;
    std::vector<client::LayerBuffers> on_device, on_host;
    std::vector<std::string> host(2 * layers.size(), std::string(bytes, char(kUntouched)));
    for (size_t i = 0; i < layers.size(); ++i) {
      on_device.push_back({layers[i], DeviceBuffer(bytes), DeviceBuffer(bytes), kCapacity});
      on_host.push_back({layers[i], host[2 * i].data(), host[2 * i + 1].data(), kCapacity});
    }
    auto mine = reader_->FetchInto(seq, on_device, options);
    ASSERT_TRUE(mine.ok()) << mine.status();
    auto theirs = client_->FetchInto(seq, on_host, options);
    ASSERT_TRUE(theirs.ok()) << theirs.status();
    EXPECT_EQ(mine->visible_tokens, theirs->visible_tokens);
    EXPECT_EQ(mine->lane_tokens, theirs->lane_tokens);
    EXPECT_EQ(mine->positions, theirs->positions);
    for (size_t i = 0; i < layers.size(); ++i) {
      EXPECT_TRUE(ToHost(on_device[i].keys, bytes) == host[2 * i]) << "keys of layer " << i;
      EXPECT_TRUE(ToHost(on_device[i].values, bytes) == host[2 * i + 1]) << "values " << i;
    }
  }

  std::unique_ptr<kernels::KernelBackend> device_;
  std::string dir_;
  std::unique_ptr<testing::KvcachedProcess> server_;
  std::unique_ptr<client::KvCacheClient> client_;
  std::unique_ptr<client::DeviceReader> reader_;
  std::vector<void*> allocations_;
};

client::CompressionSpec Int4WithResidual() {
  client::CompressionSpec spec = client::CompressionSpec{}.WithStorage(StorageFormat::kInt4G32);
  spec.residual_tokens = 16;
  return spec;
}

TEST_F(DeviceReadTest, DeviceBuffersGetExactlyWhatGrpcGives) {
  const std::string raw = Filled("gpu", 100, {}, /*extra=*/7);
  const std::string int4 = Filled("gpu", 90, Int4WithResidual());
  ASSERT_FALSE(raw.empty() || int4.empty());
  for (const std::string& seq : {raw, int4}) {
    for (DType dtype : {DType::kF16, DType::kF32}) {
      ExpectSameAsGrpc(seq, {0, 1, 2, 3}, dtype, /*include_unfinished=*/false);
    }
    ExpectSameAsGrpc(seq, {3, 1}, DType::kF16, /*include_unfinished=*/false);
  }
  ExpectSameAsGrpc(raw, {0, 2}, DType::kF16, /*include_unfinished=*/true);
  auto stats = kvc::client::AdminClient::Over(*client_).GetPoolStats("gpu");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->leases.active, 0);
  EXPECT_EQ(stats->leases.granted, stats->leases.released);
}

TEST_F(DeviceReadTest, PoolBaseAndTheLeaseLocateEveryRecord) {
  const std::string seq = Filled("gpu", 40, Int4WithResidual());
  ASSERT_FALSE(seq.empty());
  auto lease = client_->LeaseSequence(seq, {1});
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto base = reader_->PoolBase(*lease);
  ASSERT_TRUE(base.ok()) << base.status();
  // The stored records of layer 1 over gRPC, lane by lane, segment by segment.
  client::FetchOptions stored;
  stored.layers = {1};
  stored.stored_format = true;
  std::vector<client::FetchedChunk> chunks;
  ASSERT_TRUE(client_
                  ->FetchChunks(seq, stored,
                                [&](client::FetchedChunk& c) {
                                  chunks.push_back(c);
                                  return absl::OkStatus();
                                })
                  .ok());
  size_t checked = 0;
  for (const client::LeaseLane& lane : lease->lanes) {
    for (const client::LeaseSegment& seg : lane.segments) {
      const client::LeaseArena* a = lease->arena(seg.format);
      ASSERT_NE(a, nullptr);
      for (size_t t = 0; t < seg.positions.size(); ++t) {
        const auto* block =
            static_cast<const char*>(*base) + seg.blocks[t / lease->block_tokens] * a->block_bytes;
        const size_t slot = t % lease->block_tokens;
        const std::string key =
            ToHost(block + a->key_offset + slot * a->record_bytes, a->record_bytes);
        // The same token's record in the gRPC chunk of this lane and format.
        bool found = false;
        for (const client::FetchedChunk& c : chunks) {
          if (c.kv_head != lane.kv_head || c.storage != seg.format) continue;
          for (size_t j = 0; j < c.positions.size(); ++j) {
            if (c.positions[j] != seg.positions[t]) continue;
            EXPECT_EQ(key, c.keys.substr(j * a->record_bytes, a->record_bytes))
                << "head " << lane.kv_head << " position " << seg.positions[t];
            found = true;
          }
        }
        EXPECT_TRUE(found) << "position " << seg.positions[t];
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, size_t{kHeads} * 40);
  ASSERT_TRUE(client_->ReleaseLease(lease->lease_id).ok());
}

// kvcached restarts (same port, same socket path): the reader must not read the new server's
// leases through the old server's mapping (same pool name, same block ids, other memory).
TEST_F(DeviceReadTest, AfterAServerRestartReadsTheNewServersPool) {
  const std::string old_seq = Filled("gpu", 48);
  ASSERT_FALSE(old_seq.empty());
  ExpectSameAsGrpc(old_seq, {0, 1}, DType::kF16, /*include_unfinished=*/false);
  server_->Restart();
  ASSERT_FALSE(server_->target().empty()) << server_->Log();
  ASSERT_TRUE(kvc::client::AdminClient::Over(*client_)
                  .GetServerInfo()
                  .ok());  // retried until the channel reconnects
  // Other data at the same block ids in the new server's pool.
  const std::string seq = Filled("gpu", 48, {}, /*extra=*/0, /*seed=*/77);
  ASSERT_FALSE(seq.empty());
  ExpectSameAsGrpc(seq, {0, 1, 2, 3}, DType::kF16, /*include_unfinished=*/false);
}

TEST_F(DeviceReadTest, RefusalsWriteNothing) {
  const std::string host_seq = Filled("host", 20);
  const std::string seq = Filled("gpu", 50);
  ASSERT_FALSE(host_seq.empty() || seq.empty());
  const size_t bytes = size_t{kHeads} * kCapacity * kDim * 2;
  client::FetchIntoOptions options;
  options.dtype = DType::kF16;
  options.num_kv_heads = kHeads;
  options.head_dim = kDim;
  void* k = DeviceBuffer(bytes);
  void* v = DeviceBuffer(bytes);
  const std::string untouched(bytes, char(kUntouched));

  auto r = reader_->FetchInto(host_seq, {{0, k, v, kCapacity}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("not on a CUDA device"), std::string::npos) << r.status();
  r = reader_->FetchInto(seq, {{0, k, v, 49}}, options);  // one row too few
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  options.head_dim = 32;
  r = reader_->FetchInto(seq, {{0, k, v, kCapacity}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  options.head_dim = kDim;
  options.dtype = DType::kPoolDefault;
  r = reader_->FetchInto(seq, {{0, k, v, kCapacity}}, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = reader_->FetchInto("no-such-sequence", {{0, k, v, kCapacity}}, {DType::kF16, kHeads, kDim});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_TRUE(ToHost(k, bytes) == untouched && ToHost(v, bytes) == untouched);

  auto share = client::internal::ShareDeviceArena(*client_, "host", StorageFormat::kF16);
  EXPECT_EQ(share.status().code(), absl::StatusCode::kFailedPrecondition) << share.status();
  share = client::internal::ShareDeviceArena(*client_, "nope", StorageFormat::kF16);
  EXPECT_EQ(share.status().code(), absl::StatusCode::kNotFound) << share.status();
  client::ClientOptions remote;
  remote.target = server_->target();
  remote.local_reads = false;
  auto c = client::KvCacheClient::Connect(remote);
  ASSERT_TRUE(c.ok());
  share = client::internal::ShareDeviceArena(**c, "gpu", StorageFormat::kF16);
  EXPECT_EQ(share.status().code(), absl::StatusCode::kFailedPrecondition) << share.status();
  EXPECT_NE(share.status().message().find("local_reads is off"), std::string::npos);
  auto stats = kvc::client::AdminClient::Over(*client_).GetPoolStats("gpu");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases.active, 0);
}

}  // namespace
}  // namespace kvc
