// libkvc_nccl_loopback.so through transfer/nccl_api.h, on cudasim: what NCCL transfer channels
// will rely on NCCL for (a nonblocking join of two ranks, bytes between device buffers, an
// abort that ends a join or a send nobody completes, an error when the peer goes away), so
// that the stand-in they are tested against behaves as NCCL does there.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "transfer/nccl_api.h"

namespace kvc::nccl {
namespace {

using ::testing::HasSubstr;

const Api& Loopback() {
  absl::StatusOr<const Api*> api = Load(KVC_NCCL_LOOPBACK);
  EXPECT_TRUE(api.ok()) << api.status();
  return **api;
}

// Polls the comm's async state until it leaves kInProgress or `seconds` pass.
Result Settle(const Api& api, Comm comm, int seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  Result state = kInProgress;
  while (std::chrono::steady_clock::now() < until) {
    if (api.comm_get_async_error(comm, &state) != kSuccess) return -1;
    if (state != kInProgress) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return state;
}

// A nonblocking comm's send or receive: kInProgress at the call, then its outcome.
Result Done(const Api& api, Comm comm, Result at_call) {
  return at_call == kInProgress ? Settle(api, comm) : at_call;
}

struct Pair {
  Comm rank0 = nullptr;
  Comm rank1 = nullptr;
};

// Both ranks join nonblocking, as kvcached (rank 0) and a reader (rank 1) will.
Pair Join(const Api& api) {
  UniqueId id{};
  EXPECT_EQ(api.get_unique_id(&id), kSuccess);
  Config config;
  Pair p;
  EXPECT_EQ(api.comm_init_rank_config(&p.rank0, 2, id, 0, &config), kInProgress);
  EXPECT_EQ(api.comm_init_rank_config(&p.rank1, 2, id, 1, &config), kInProgress);
  EXPECT_EQ(Settle(api, p.rank0), kSuccess);
  EXPECT_EQ(Settle(api, p.rank1), kSuccess);
  return p;
}

void* DeviceBuffer(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  return p;
}

TEST(NcclLoopbackTest, LoadsAsNccl) {
  const Api& api = Loopback();
  EXPECT_EQ(api.version, kMinVersion);
  EXPECT_THAT(api.Describe(), HasSubstr("NCCL 2.14.0 ("));
}

TEST(NcclLoopbackTest, MovesBytesBetweenDeviceBuffersInCallOrder) {
  const Api& api = Loopback();
  Pair p = Join(api);
  // Over two 4 MiB pieces and not a multiple of anything, then a small second message.
  const size_t big = (size_t{9} << 20) + 123, small = 32;
  std::vector<uint8_t> a(big), b(small);
  for (size_t i = 0; i < big; ++i) a[i] = static_cast<uint8_t>(i * 131 + (i >> 13));
  for (size_t i = 0; i < small; ++i) b[i] = static_cast<uint8_t>(255 - i);
  void* src_a = DeviceBuffer(big);
  void* src_b = DeviceBuffer(small);
  void* dst_a = DeviceBuffer(big);
  void* dst_b = DeviceBuffer(small);
  ASSERT_EQ(cudaMemcpy(src_a, a.data(), big, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src_b, b.data(), small, cudaMemcpyHostToDevice), cudaSuccess);
  Result sent_a = -1, sent_b = -1;
  std::thread sender([&] {
    sent_a = Done(api, p.rank0, api.send(src_a, big, kUint8, 1, p.rank0, nullptr));
    sent_b = Done(api, p.rank0, api.send(src_b, small, kUint8, 1, p.rank0, nullptr));
  });
  EXPECT_EQ(Done(api, p.rank1, api.recv(dst_a, big, kUint8, 0, p.rank1, nullptr)), kSuccess);
  EXPECT_EQ(Done(api, p.rank1, api.recv(dst_b, small, kUint8, 0, p.rank1, nullptr)), kSuccess);
  sender.join();
  EXPECT_EQ(sent_a, kSuccess);
  EXPECT_EQ(sent_b, kSuccess);
  std::vector<uint8_t> got_a(big), got_b(small);
  ASSERT_EQ(cudaMemcpy(got_a.data(), dst_a, big, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_b.data(), dst_b, small, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(got_a == a);
  EXPECT_TRUE(got_b == b);
  EXPECT_EQ(api.comm_destroy(p.rank0), kSuccess);
  EXPECT_EQ(api.comm_destroy(p.rank1), kSuccess);
  for (void* d : {src_a, src_b, dst_a, dst_b}) EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST(NcclLoopbackTest, RefusesHostBuffersWrongPeersAndUnjoinedComms) {
  const Api& api = Loopback();
  Pair p = Join(api);
  std::vector<uint8_t> host(64);
  void* device = DeviceBuffer(64);
  EXPECT_EQ(api.send(host.data(), host.size(), kUint8, 1, p.rank0, nullptr), 4);  // invalid arg
  EXPECT_EQ(api.send(device, 64, kUint8, 0, p.rank0, nullptr), 4);                // itself
  EXPECT_EQ(api.send(device, 16, 7, 1, p.rank0, nullptr), 4);                     // floats
  EXPECT_THAT(api.Check(4, "ncclSend").message(), HasSubstr("device buffers only"));
  EXPECT_EQ(api.comm_destroy(p.rank0), kSuccess);
  EXPECT_EQ(api.comm_destroy(p.rank1), kSuccess);
  // A comm whose peer has not joined yet cannot send.
  UniqueId id{};
  ASSERT_EQ(api.get_unique_id(&id), kSuccess);
  Config config;
  Comm alone = nullptr;
  ASSERT_EQ(api.comm_init_rank_config(&alone, 2, id, 0, &config), kInProgress);
  EXPECT_EQ(api.send(device, 64, kUint8, 1, alone, nullptr), 5);  // invalid usage
  EXPECT_EQ(api.comm_abort(alone), kSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
}

TEST(NcclLoopbackTest, AReceiveOfAnotherSizeFails) {
  const Api& api = Loopback();
  Pair p = Join(api);
  void* src = DeviceBuffer(32);
  void* dst = DeviceBuffer(32);
  EXPECT_EQ(api.send(src, 32, kUint8, 1, p.rank0, nullptr), kInProgress);
  EXPECT_EQ(Done(api, p.rank1, api.recv(dst, 16, kUint8, 0, p.rank1, nullptr)), 5);
  EXPECT_EQ(api.comm_destroy(p.rank1), kSuccess);
  EXPECT_EQ(api.comm_destroy(p.rank0), kSuccess);
  EXPECT_EQ(cudaFree(src), cudaSuccess);
  EXPECT_EQ(cudaFree(dst), cudaSuccess);
}

TEST(NcclLoopbackTest, AbortEndsAJoinNobodyCompletes) {
  const Api& api = Loopback();
  UniqueId id{};
  ASSERT_EQ(api.get_unique_id(&id), kSuccess);
  Config config;
  Comm comm = nullptr;
  ASSERT_EQ(api.comm_init_rank_config(&comm, 2, id, 0, &config), kInProgress);
  EXPECT_EQ(Settle(api, comm, 1), kInProgress);  // nobody joins
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(api.comm_abort(comm), kSuccess);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(NcclLoopbackTest, AbortEndsASendNobodyReceives) {
  const Api& api = Loopback();
  Pair p = Join(api);
  const size_t bytes = size_t{64} << 20;  // far more than a socket buffers
  void* src = DeviceBuffer(bytes);
  EXPECT_EQ(api.send(src, bytes, kUint8, 1, p.rank0, nullptr), kInProgress);
  EXPECT_EQ(Settle(api, p.rank0, 1), kInProgress) << "nobody receives";
  Result second = api.send(src, 16, kUint8, 1, p.rank0, nullptr);
  EXPECT_EQ(second, 5) << "one operation at a time, as NCCL's nonblocking comms";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(api.comm_abort(p.rank0), kSuccess);  // as a watchdog would
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(api.comm_destroy(p.rank1), kSuccess);
  EXPECT_EQ(cudaFree(src), cudaSuccess);
}

TEST(NcclLoopbackTest, APeerThatGoesAwayFailsTheNextSend) {
  const Api& api = Loopback();
  Pair p = Join(api);
  EXPECT_EQ(api.comm_destroy(p.rank1), kSuccess);
  void* src = DeviceBuffer(size_t{8} << 20);
  EXPECT_EQ(Done(api, p.rank0, api.send(src, size_t{8} << 20, kUint8, 1, p.rank0, nullptr)),
            6);  // remote error
  Result state = kSuccess;
  EXPECT_EQ(api.comm_get_async_error(p.rank0, &state), kSuccess);
  EXPECT_EQ(state, 6) << "the error stays";
  EXPECT_EQ(api.send(src, 16, kUint8, 1, p.rank0, nullptr), 6);
  EXPECT_EQ(api.comm_destroy(p.rank0), kSuccess);
  EXPECT_EQ(cudaFree(src), cudaSuccess);
}

}  // namespace
}  // namespace kvc::nccl
