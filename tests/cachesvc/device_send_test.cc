// SendLeasedBlocks to a sink that sends from pool memory (the NCCL channel's kind): on a
// device pool (cudasim's cuda:0 in CI, a GPU through tests/gpu) its pieces lie in the pool's
// device memory, come in the sizes transfer/payload.h documents (a reader that must
// post each piece's size computes them from the lease), and hold exactly what a host sink
// receives for the same lease; a host pool's lease is refused before anything is sent.
#include <algorithm>
#include <string>
#include <vector>

#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/transport/lease_sender.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/cachesvc/compression_fixture.h"
#include "tests/testing/host_collect.h"
#include "tests/testing/pool_device.h"
#include "tests/testing/status_matchers.h"
#include "transfer/payload.h"

namespace kvc::cachesvc {
namespace {

using ::kvc::testing::HostCollect;
using ::kvc::testing::StatusIs;

// Pieces in the pool's memory, copied out through the pool's backend (on cudasim a host
// pointer here would be refused by the copy: the pieces must be device memory).
class PoolMemoryCollect final : public BlockSink {
 public:
  explicit PoolMemoryCollect(BlockPool* pool) : pool_(pool) {}
  std::string bytes;
  std::vector<size_t> pieces;
  int64_t announced = -1;
  const BlockPool* SendsFromPool() const override { return pool_; }
  absl::Status Begin(int64_t /*blocks*/, int64_t n) override {
    announced = n;
    return absl::OkStatus();
  }
  absl::Status Write(const char* data, size_t n) override {
    pieces.push_back(n);
    std::string host(n, '\0');
    kernels::KernelBackend* b = pool_->backend();
    kernels::KernelStatus ks = b->CopyToHost(host.data(), data, n, kernels::StreamHandle{});
    if (ks.ok()) ks = b->Synchronize(kernels::StreamHandle{});
    if (!ks.ok()) return absl::InternalError(ks.detail);
    bytes += host;
    return absl::OkStatus();
  }

 private:
  BlockPool* pool_;
};

class DeviceSendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // head_dim 256: 32 KiB f32 blocks, 128 per 4 MiB piece, so a format spans several.
    Geometry g;
    g.layers = 2;
    g.heads = 2;
    g.dim = 256;
    auto created = KvStore::Create(Options(g, int64_t{256} << 20));
    ASSERT_TRUE(created.ok()) << created.status();
    store_ = std::move(*created);
    auto seq = store_->CreateSequence(CreateSequenceParams{TenantScope(), "", "", "", {}, {}});
    ASSERT_TRUE(seq.ok()) << seq.status();
    id_ = seq->id;
    const int64_t n = 16 * 70 + 5;  // 70 whole blocks + 5 tokens per lane
    for (int l = 0; l < g.layers; ++l) {
      const std::vector<float> k = Gaussian(static_cast<size_t>(n * g.heads * g.dim), 11 + l);
      const std::vector<float> v = Gaussian(k.size(), 97 + l);
      AppendParams a;
      a.sequence_id = id_;
      a.layer = l;
      a.num_tokens = n;
      a.dtype = DType::kF32;
      a.keys = Bytes(k);
      a.values = Bytes(v);
      ASSERT_TRUE(store_->Append(a).ok());
    }
  }
  // Sends a lease of the sequence to both sinks and checks them against each other and the
  // piece rule; returns the device sink's piece count.
  size_t SendBothWays();
  std::unique_ptr<KvStore> store_;
  std::string id_;
};

size_t DeviceSendTest::SendBothWays() {
  auto lease = store_->leases().LeaseSequence(LeaseParams{TenantScope(), id_, {}, 0});
  EXPECT_TRUE(lease.ok()) << lease.status();
  if (!lease.ok()) return 0;
  BlockPool* pool = *store_->leases().FindPool("c");
  PoolMemoryCollect device(pool);
  auto sent = SendLeasedBlocks(store_->leases(), TenantScope(), lease->lease_id, &device);
  EXPECT_TRUE(sent.ok()) << sent.status();
  HostCollect host;
  EXPECT_TRUE(SendLeasedBlocks(store_->leases(), TenantScope(), lease->lease_id, &host).ok());
  EXPECT_TRUE(store_->leases().ReleaseLease(TenantScope(), lease->lease_id).ok());
  if (!sent.ok()) return 0;
  EXPECT_EQ(device.announced, sent->bytes);
  EXPECT_EQ(static_cast<int64_t>(device.bytes.size()), sent->bytes);
  EXPECT_TRUE(device.bytes == host.bytes) << "the device pieces differ from the host payload";
  // The documented piece sizes, computed from the lease alone.
  std::vector<size_t> expected;
  for (int f = 0; f < kernels::kNumStorageFormats; ++f) {
    size_t blocks = 0, block_bytes = 0;
    for (const kernels::BlockLayout& l : lease->layouts) {
      if (static_cast<int>(l.format) == f) block_bytes = l.block_bytes;
    }
    for (const LeasedLane& lane : lease->lanes) {
      for (const LeasedSegment& seg : lane.segments) {
        if (static_cast<int>(seg.format) == f) blocks += seg.blocks.size();
      }
    }
    for (size_t at = 0; at < blocks; at += transfer::PieceBlocks(block_bytes)) {
      expected.push_back(std::min(transfer::PieceBlocks(block_bytes), blocks - at) * block_bytes);
    }
  }
  EXPECT_EQ(device.pieces, expected);
  return device.pieces.size();
}

TEST_F(DeviceSendTest, PiecesInPoolMemoryHoldWhatAHostSinkGets) {
  if (testing::TestPoolDevice() == "cpu") {
    KVC_ASSERT_OK_AND_ASSIGN(const LeaseSnapshot lease, store_->leases().LeaseSequence(LeaseParams{
                                                            TenantScope(), id_, {}, 0}));
    PoolMemoryCollect device(*store_->leases().FindPool("c"));
    EXPECT_THAT(SendLeasedBlocks(store_->leases(), TenantScope(), lease.lease_id, &device).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "in host memory"));
    EXPECT_EQ(device.announced, -1) << "refused before Begin";
    return;
  }
  // f32 only: 4 lanes x 71 blocks of 32 KiB, 128 blocks per piece.
  EXPECT_EQ(SendBothWays(), 3u);
  // Two formats per lane: INT4 and a raw f32 residual of 40 tokens.
  CompressionSpec tiers = Int4();
  tiers.residual_tokens = 40;
  KVC_ASSERT_OK(Mutate(*store_, id_, tiers));
  EXPECT_GE(SendBothWays(), 2u);
}

}  // namespace
}  // namespace kvc::cachesvc
