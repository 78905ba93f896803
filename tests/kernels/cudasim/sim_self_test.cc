// Tests of cudasim itself: each of its checks is shown to catch a planted bug (kernels in
// sim_self_test_kernels.cu, host misuse here) and to pass the correct twin.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_self_test_kernels.h"

namespace kvc_sim_test {
namespace {

// Allocates device memory holding `init` (copied with the blocking cudaMemcpy).
int* DeviceInts(const std::vector<int>& init) {
  int* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, init.size() * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, init.data(), init.size() * sizeof(int), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}
std::vector<int> HostInts(const int* device, size_t n) {
  std::vector<int> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// How a fault at device memory ends the process: killed by SIGSEGV after cudasim's message,
// or, under AddressSanitizer or ThreadSanitizer (whose handler takes the signal), after its
// report: a nonzero exit, or SIGABRT with abort_on_error=1 (the asan test preset sets it). A
// fault near a fiber's stack may be called a stack-overflow.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
bool DiedOfSegv(int status) {
  return (WIFEXITED(status) && WEXITSTATUS(status) != 0) ||
         (WIFSIGNALED(status) && (WTERMSIG(status) == SIGABRT || WTERMSIG(status) == SIGSEGV));
}
constexpr char kHostFault[] = "Sanitizer: SEGV on unknown address";
constexpr char kDeviceFault[] = "Sanitizer: [A-Za-z-]+ on (unknown )?address";
#else
bool DiedOfSegv(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV; }
constexpr char kHostFault[] = "host code accessed device memory";
constexpr char kDeviceFault[] = "device work accessed .* outside the 256-byte";
#endif

// (a) Device memory is PROT_NONE to host code: a host dereference dies with SIGSEGV.
TEST(CudaSimDeathTest, HostReadOfDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int* dev = DeviceInts({7});
  EXPECT_EXIT(
      {
        volatile int x = dev[0];
        (void)x;
        std::_Exit(0);
      },
      DiedOfSegv, kHostFault);
  // An interior address of a larger allocation too, and a host write.
  int* big = DeviceInts(std::vector<int>(5000, 1));
  EXPECT_EXIT(
      {
        volatile int x = big[4321];
        (void)x;
        std::_Exit(0);
      },
      DiedOfSegv, kHostFault);
  EXPECT_EXIT(
      {
        big[10] = 3;
        std::_Exit(0);
      },
      DiedOfSegv, kHostFault);
  cudaFree(big);
  cudaFree(dev);
}

// Device work past the end of an allocation faults too (the allocation ends at a guard
// page; 64 ints are a whole number of cudaMalloc's 256-byte granules).
TEST(CudaSimDeathTest, KernelPastAllocationEndDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int* dev = DeviceInts(std::vector<int>(64, 0));
  EXPECT_EXIT(
      {
        LaunchFill(dev, 65, 1, nullptr);
        cudaDeviceSynchronize();
        std::_Exit(0);
      },
      DiedOfSegv, kDeviceFault);
  LaunchFill(dev, 64, 1, /*s=*/nullptr);  // the correct bound
  EXPECT_EQ(HostInts(dev, 64), std::vector<int>(64, 1));
  cudaFree(dev);
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer the bytes between an allocation's end and its guard page are
// poisoned: one element past 63 ints (inside the last 256-byte granule) is reported.
TEST(CudaSimDeathTest, KernelPastAllocationEndInsideGranuleIsReportedByAsan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int* dev = DeviceInts(std::vector<int>(63, 0));
  EXPECT_DEATH(
      {
        LaunchFill(dev, 64, 1, /*s=*/nullptr);
        cudaDeviceSynchronize();
      },
      "AddressSanitizer: [a-z-]+ on address");
  cudaFree(dev);
}
#endif

// (a) The same read inside a kernel works (memory is opened while device work runs).
TEST(CudaSim, KernelReadsDeviceMemory) {
  int* in = DeviceInts({7});
  int* out = DeviceInts({0});
  LaunchCopyOne(in, out, /*s=*/nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(HostInts(out, 1), std::vector<int>{7});
  cudaFree(in);
  cudaFree(out);
}

// (b) A D2H copy lands only when the stream is synchronized: a host that reads the result
// before synchronizing sees the old bytes (pinned and pageable destinations alike).
TEST(CudaSim, AsyncCopyToHostLandsAtSynchronize) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* dev = DeviceInts({0, 0, 0, 0});
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 4 * sizeof(int)), cudaSuccess);
  std::vector<int> pageable(4, -5);
  for (int i = 0; i < 4; ++i) pinned[i] = -5;
  LaunchFill(dev, 4, 42, s);
  ASSERT_EQ(cudaMemcpyAsync(pinned, dev, 4 * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), dev, 4 * sizeof(int), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  EXPECT_EQ(std::vector<int>(pinned, pinned + 4), std::vector<int>(4, -5));  // missing sync
  EXPECT_EQ(pageable, std::vector<int>(4, -5));
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(std::vector<int>(pinned, pinned + 4), std::vector<int>(4, 42));
  EXPECT_EQ(pageable, std::vector<int>(4, 42));
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(s);
}

// (b) A pinned source is read when the copy executes (reusing it before synchronizing
// changes what is copied, as on a GPU); a pageable source is staged at the call.
TEST(CudaSim, AsyncCopyFromHostReadsPinnedLateAndPageableEarly) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* dev = DeviceInts({0, 0});
  int* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, sizeof(int), cudaHostAllocDefault), cudaSuccess);
  int pageable = 1;
  *pinned = 1;
  ASSERT_EQ(cudaMemcpyAsync(dev, pinned, sizeof(int), cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev + 1, &pageable, sizeof(int), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  *pinned = 2;  // planted bug: the source is reused before the stream is synchronized
  pageable = 2;
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(HostInts(dev, 2), (std::vector<int>{2, 1}));
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(s);
}

// Legacy default stream semantics: the blocking cudaMemcpy waits for blocking streams'
// earlier work but not for a non-blocking stream's.
TEST(CudaSim, BlockingCopyWaitsForBlockingStreamsOnly) {
  for (unsigned flags : {cudaStreamDefault, cudaStreamNonBlocking}) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    int* dev = DeviceInts({0});
    LaunchFill(dev, 1, 9, s);
    EXPECT_EQ(HostInts(dev, 1), std::vector<int>{flags == cudaStreamDefault ? 9 : 0});
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(HostInts(dev, 1), std::vector<int>{9});
    cudaFree(dev);
    cudaStreamDestroy(s);
  }
}

// Launch configuration errors come from cudaGetLastError at once; errors while executing
// (a warp collective some lanes never reach) from the call that synchronizes the stream.
TEST(CudaSim, LaunchErrorsAtLaunchExecutionErrorsAtSynchronize) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  LaunchTooManyThreads(s);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  LaunchDivergentWarp(s);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // reported once
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);  // destroyed
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

// (c) A static __shared__ array read before any thread of the block wrote it holds the
// poison (0xff bytes) in every block, not the previous block's values; the correct kernel
// reads what was written.
TEST(CudaSim, StaticSharedIsPoisonedPerBlock) {
  const int blocks = 3;
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, blocks * 32 * sizeof(float)), cudaSuccess);
  std::vector<uint32_t> got(blocks * 32);
  LaunchSharedRead(dev, blocks, /*write_first=*/false, /*s=*/nullptr);
  ASSERT_EQ(cudaMemcpy(got.data(), dev, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 0xffffffffu) << "element " << i;
  LaunchSharedRead(dev, blocks, /*write_first=*/true, /*s=*/nullptr);
  std::vector<float> ok(blocks * 32);
  ASSERT_EQ(cudaMemcpy(ok.data(), dev, ok.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < ok.size(); ++i) EXPECT_EQ(ok[i], static_cast<float>(i));
  cudaFree(dev);
}

// (d) A result that depends on block order: in order block b sees block b - 1's write, in
// a shuffled (or reversed) order it does not.
TEST(CudaSim, ShuffledBlocksExposeOrderDependence) {
  const int blocks = 64;
  std::vector<int> in_order(blocks);
  for (int b = 0; b < blocks; ++b) in_order[b] = b + 1;
  auto run = [&](kvc_sim::Order order, uint64_t seed) {
    kvc_sim::SetOrder(order, seed);
    int* a = DeviceInts(std::vector<int>(blocks, 0));
    LaunchChain(a, blocks, /*s=*/nullptr);
    std::vector<int> r = HostInts(a, blocks);
    cudaFree(a);
    return r;
  };
  EXPECT_EQ(run(kvc_sim::Order::kForward, 1), in_order);
  const std::vector<int> shuffled = run(kvc_sim::Order::kShuffle, 1);
  EXPECT_NE(shuffled, in_order);
  EXPECT_EQ(run(kvc_sim::Order::kShuffle, 1), shuffled);  // seeded: reproducible
  EXPECT_NE(run(kvc_sim::Order::kShuffle, 2), shuffled);
  EXPECT_NE(run(kvc_sim::Order::kReverse, 1), in_order);
  kvc_sim::SetOrder(kvc_sim::Order::kForward, 1);
}

// Threads are resumed in a shuffled order too: a read of a neighbour's shared write without
// __syncthreads is caught; with the barrier every order agrees.
TEST(CudaSim, ShuffledThreadsExposeMissingBarrier) {
  int* dev = DeviceInts(std::vector<int>(32, 0));
  std::vector<int> want(32);
  for (int t = 0; t < 32; ++t) want[t] = t - 1;
  for (bool barrier : {true, false}) {
    kvc_sim::SetOrder(kvc_sim::Order::kShuffle, 3);
    LaunchNeighbour(dev, barrier, /*s=*/nullptr);
    const std::vector<int> got = HostInts(dev, 32);
    if (barrier)
      EXPECT_EQ(got, want);
    else
      EXPECT_NE(got, want);
  }
  kvc_sim::SetOrder(kvc_sim::Order::kForward, 1);
  cudaFree(dev);
}

// (e) Pointer attributes: device for any address inside a device allocation, host for
// pinned memory, unregistered for malloc'd memory and past the allocation's pages.
TEST(CudaSim, PointerAttributes) {
  char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 10000), cudaSuccess);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, dev + 5000), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.devicePointer, dev + 5000);
  EXPECT_EQ(a.hostPointer, nullptr);
  ASSERT_EQ(cudaPointerGetAttributes(&a, dev), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 100), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(pinned) + 50), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  void* host = std::malloc(100);
  ASSERT_EQ(cudaPointerGetAttributes(&a, host), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  ASSERT_EQ(cudaPointerGetAttributes(&a, dev + (64 << 10)), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  std::free(host);
  cudaFreeHost(pinned);
  cudaFree(dev);
  ASSERT_EQ(cudaPointerGetAttributes(&a, dev + 5000), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);  // freed
}

// Copies and memsets are checked against the allocations: past the end of a device
// allocation, or with a kind that does not match the pointers, they fail.
TEST(CudaSim, CopiesCheckRangesAndKinds) {
  char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 100), cudaSuccess);
  std::vector<char> host(200);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 101, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), dev + 50, 51, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 100, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(host.data(), 0, 10), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(dev + 90, 0, 11), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 100, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(cudaMemset(dev, 0, 100), cudaSuccess);
  cudaFree(dev);
}

// A simulated capacity: cudaMemGetInfo reports it and cudaMalloc fails past it.
TEST(CudaSim, DeviceCapacity) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(total, prop.totalGlobalMem);
  if (const char* v = std::getenv("KVC_CUDASIM_DEVICE_BYTES")) {
    EXPECT_EQ(total, std::strtoull(v, nullptr, 0));
  }
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, free0 + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaMalloc(&p, free0 / 2), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_LE(free1, free0 - free0 / 2);
  EXPECT_GT(free1 + 2 * 4096 * 16, free0 - free0 / 2);  // page rounding only
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, free0 / 2 + (64 << 10)), cudaErrorMemoryAllocation);
  cudaGetLastError();
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0);
}

// CUDA IPC: another process opens the exported pool and reads and writes the same bytes,
// through copies and kernels; the exporter cannot open its own handle; a handle of a freed
// allocation no longer opens; small allocations cannot be exported; cudaFree of an opened
// handle and cudaIpcCloseMemHandle of an allocation are errors.
TEST(CudaSim, IpcSharesAnAllocationWithAnotherProcess) {
  const int n = (2 << 20) / sizeof(int);  // 2 MiB: above the sim's 1 MiB export minimum
  std::vector<int> init(n);
  for (int i = 0; i < n; ++i) init[i] = i * 3 + 1;
  int* pool = DeviceInts(init);
  cudaIpcMemHandle_t h{};
  ASSERT_EQ(cudaIpcGetMemHandle(&h, pool), cudaSuccess);
  void* self = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&self, h, cudaIpcMemLazyEnablePeerAccess),
            cudaErrorDeviceUninitialized);
  EXPECT_EQ(cudaGetLastError(), cudaErrorDeviceUninitialized);
  int* small = DeviceInts({1, 2, 3});
  cudaIpcMemHandle_t hs{};
  EXPECT_EQ(cudaIpcGetMemHandle(&hs, small), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaIpcCloseMemHandle(pool), cudaErrorInvalidResourceHandle);
  cudaGetLastError();

  // The child: a process of its own (fork; no other thread of this test runs). Its exit
  // code says which check failed.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) _exit(10);
    int* q = static_cast<int*>(p);
    std::vector<int> got(n);
    if (cudaMemcpy(got.data(), q, n * sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess ||
        got != init) {
      _exit(11);
    }
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer loses track of the sim's fibers in a forked child (it reports a race
    // on the scheduler's state and exits): the write is a copy there.
    const std::vector<int> sevens(16, 77);
    if (cudaMemcpy(q, sevens.data(), 16 * sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess) {
      _exit(12);
    }
#else
    LaunchFill(q, 16, 77, /*s=*/nullptr);  // a kernel on the opened memory
#endif
    if (cudaDeviceSynchronize() != cudaSuccess) _exit(12);
    if (cudaFree(p) != cudaErrorInvalidValue) _exit(13);  // not an allocation of this process
    cudaGetLastError();
    if (cudaIpcCloseMemHandle(p) != cudaSuccess) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's failed check (see the exit codes above)";
  std::vector<int> after = HostInts(pool, n);
  EXPECT_EQ(std::vector<int>(after.begin(), after.begin() + 16), std::vector<int>(16, 77));
  EXPECT_TRUE(std::equal(after.begin() + 16, after.end(), init.begin() + 16));

  // A freed allocation's handle does not open (its memfd is gone).
  ASSERT_EQ(cudaFree(pool), cudaSuccess);
  const pid_t late = fork();
  ASSERT_GE(late, 0);
  if (late == 0) {
    void* p = nullptr;
    _exit(cudaIpcOpenMemHandle(&p, h, 0) == cudaErrorInvalidResourceHandle ? 0 : 20);
  }
  ASSERT_EQ(waitpid(late, &status, 0), late);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  cudaFree(small);
}

// The last error is per host thread, as in CUDA.
TEST(CudaSim, LastErrorIsPerThread) {
  std::thread([] { LaunchTooManyThreads(nullptr); }).join();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// (f) Host threads on their own streams, concurrently: copies in and out through pinned
// buffers, kernels, stream-ordered scratch, allocations while others' work runs.
TEST(CudaSim, ConcurrentHostThreads) {
  constexpr int kThreads = 8, kIters = 150, kN = 300;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        ++failures;
        return;
      }
      int *in = nullptr, *out = nullptr, *dev = nullptr;
      cudaMallocHost(&in, kN * sizeof(int));
      cudaMallocHost(&out, kN * sizeof(int));
      cudaMalloc(&dev, kN * sizeof(int));
      for (int it = 0; it < kIters; ++it) {
        for (int i = 0; i < kN; ++i) in[i] = t * 100000 + it * 100 + i % 97;
        int* scratch = nullptr;
        cudaMallocAsync(&scratch, kN * sizeof(int), s);
        cudaMemcpyAsync(scratch, in, kN * sizeof(int), cudaMemcpyHostToDevice, s);
        LaunchAddOne(scratch, kN, s);
        cudaMemcpyAsync(dev, scratch, kN * sizeof(int), cudaMemcpyDeviceToDevice, s);
        cudaFreeAsync(scratch, s);
        LaunchAddOne(dev, kN, s);
        cudaMemcpyAsync(out, dev, kN * sizeof(int), cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess || cudaGetLastError() != cudaSuccess)
          ++failures;
        for (int i = 0; i < kN; ++i)
          if (out[i] != in[i] + 2) ++failures;
      }
      cudaFree(dev);
      cudaFreeHost(in);
      cudaFreeHost(out);
      cudaStreamDestroy(s);
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kvc_sim_test
