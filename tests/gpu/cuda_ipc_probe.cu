// kvc_cuda_ipc_probe: the real-GPU facts that issue #13's device-pool leases (item 3) are designed
// on, measured between two processes on one GPU. Kernels-level only (CUDA runtime, and the
// driver's VMM calls reached through cudaGetDriverEntryPointByVersion, so nothing links libcuda).
//
//   legacy   the parent cudaMallocs a pool (one allocation, as DeviceBlockPool does), fills it,
//            exports cudaIpcGetMemHandle + an interprocess event recorded after a slow kernel
//            that rewrites the first region; a child process (posix_spawn of this binary, never
//            fork after CUDA init) opens both, reads the region once WITHOUT waiting (expected
//            to see the old data: shows the event orders something), then waits on the event and
//            must see the new data; verifies the whole pool, times the open, measures D2D copy
//            bandwidth out of the mapping against a local D2D copy, and writes a region the
//            parent then verifies. Also records what opening one's own handle in the same
//            process returns (the simulator must answer the same).
//   vmm      the same with cuMemCreate(POSIX_FILE_DESCRIPTOR) + cuMemExportToShareableHandle:
//            the child inherits the fd (standing in for SCM_RIGHTS over the lease socket),
//            imports, maps read-write and verifies.
//
//   kvc_cuda_ipc_probe [--mib N] [--json FILE]
// Exit 0 when every step passed (or SKIP without a GPU), 1 when one failed.
#include <cuda.h>
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

extern char** environ;

namespace {

bool Ok(cudaError_t e, const char* what, int line) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "CUDA error at line %d: %s: %s\n", line, what, cudaGetErrorString(e));
  cudaGetLastError();
  return false;
}
#define CK(call) Ok((call), #call, __LINE__)

bool DrvOk(CUresult r, const char* what, int line) {
  if (r == CUDA_SUCCESS) return true;
  std::fprintf(stderr, "driver error at line %d: %s: CUresult %d\n", line, what,
               static_cast<int>(r));
  return false;
}
#define DK(call) DrvOk((call), #call, __LINE__)

constexpr size_t kRegionBytes = 64ull << 20;  // the event-ordered region and the child's write

__device__ __host__ inline uint32_t Word(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 29));
}

__global__ void Fill(uint32_t* p, uint64_t words, uint64_t first, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    p[i] = Word(first + i, seed);
  }
}

// Spins for `ns` (one thread does the waiting), then fills: stands in for a service write that
// is still running when the lease is handed out.
__global__ void SlowFill(uint32_t* p, uint64_t words, uint64_t first, uint32_t seed, uint64_t ns) {
  if (threadIdx.x == 0) {
    const uint64_t t0 = clock64();
    int clock_khz = 1500000;  // lower bound of the SM clock: waits at least ns
    while (static_cast<uint64_t>(clock64() - t0) < ns * clock_khz / 1000000) {
    }
  }
  __syncthreads();
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    p[i] = Word(first + i, seed);
  }
}

__global__ void CountMismatches(const uint32_t* p, uint64_t words, uint64_t first, uint32_t seed,
                                unsigned long long* bad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += uint64_t{gridDim.x} * blockDim.x) {
    local += p[i] != Word(first + i, seed);
  }
  if (local) atomicAdd(bad, local);
}

// Mismatching words of [first, first + words) against seed, on `stream`.
long long Mismatches(const void* base, size_t byte_offset, size_t bytes, uint32_t seed,
                     cudaStream_t stream) {
  unsigned long long* d = nullptr;
  unsigned long long h = 0;
  if (!CK(cudaMalloc(&d, sizeof(*d)))) return -1;
  const uint64_t first = byte_offset / 4;
  bool ok = CK(cudaMemsetAsync(d, 0, sizeof(*d), stream));
  CountMismatches<<<1024, 256, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(static_cast<const char*>(base) + byte_offset), bytes / 4,
      first, seed, d);
  ok = ok && CK(cudaGetLastError()) &&
       CK(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, stream)) &&
       CK(cudaStreamSynchronize(stream));
  cudaFree(d);
  return ok ? static_cast<long long>(h) : -1;
}

void FillRange(void* base, size_t byte_offset, size_t bytes, uint32_t seed) {
  Fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(static_cast<char*>(base) + byte_offset),
                      bytes / 4, byte_offset / 4, seed);
}

std::string Hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}
bool Unhex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(p)[i] = v(s[2 * i]) << 4 | v(s[2 * i + 1]);
  return true;
}

// Median GB/s (bytes read + written) of cudaMemcpy D2D src -> dst over 5 timed copies.
double CopyGbps(void* dst, const void* src, size_t bytes) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(a);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    if (r >= 2) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

double Ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
    std::perror("posix_spawn");
    return -1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ---- driver VMM calls, resolved at run time
struct Vmm {
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  bool Load() {
    auto get = [](const char* name, auto* fn) {
      cudaDriverEntryPointQueryResult q{};
      void* p = nullptr;
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || p == nullptr) {
        std::fprintf(stderr, "driver entry point %s not found\n", name);
        return false;
      }
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
      return true;
    };
    return get("cuMemCreate", &create) && get("cuMemRelease", &release) &&
           get("cuMemExportToShareableHandle", &export_handle) &&
           get("cuMemImportFromShareableHandle", &import_handle) &&
           get("cuMemAddressReserve", &reserve) && get("cuMemAddressFree", &address_free) &&
           get("cuMemMap", &map) && get("cuMemUnmap", &unmap) &&
           get("cuMemSetAccess", &set_access) && get("cuMemGetAllocationGranularity", &granularity);
  }
};

CUmemAllocationProp PosixFdProp() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Maps `handle` (size bytes) read-write on device 0; returns the address or 0.
CUdeviceptr MapVmm(const Vmm& v, CUmemGenericAllocationHandle handle, size_t size) {
  CUdeviceptr ptr = 0;
  if (!DK(v.reserve(&ptr, size, 0, 0, 0))) return 0;
  if (!DK(v.map(ptr, size, 0, handle, 0))) return 0;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!DK(v.set_access(ptr, size, &access, 1))) return 0;
  return ptr;
}

// ---- children: print "key value" lines the parent copies into its JSON
int ChildLegacy(const std::string& mem_hex, const std::string& ev_hex, size_t bytes) {
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  if (!Unhex(mem_hex, &mh, sizeof(mh)) || !Unhex(ev_hex, &eh, sizeof(eh))) return 2;
  if (!CK(cudaSetDevice(0))) return 1;
  cudaStream_t s;
  if (!CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) return 1;
  void* pool = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  if (!CK(cudaIpcOpenMemHandle(&pool, mh, cudaIpcMemLazyEnablePeerAccess))) return 1;
  std::printf("child_open_mem_ms %.3f\n", Ms(t0));
  cudaEvent_t ev;
  const auto t1 = std::chrono::steady_clock::now();
  if (!CK(cudaIpcOpenEventHandle(&ev, eh))) return 1;
  std::printf("child_open_event_ms %.3f\n", Ms(t1));
  // Before waiting: the parent's slow kernel should still be spinning, so the region still
  // holds seed 1 (informational; a fast child start could miss it).
  const long long before = Mismatches(pool, 0, kRegionBytes, 1, s);
  std::printf("child_unordered_read_saw_old_data %d\n", before == 0 ? 1 : 0);
  if (!CK(cudaStreamWaitEvent(s, ev, 0))) return 1;
  const long long after = Mismatches(pool, 0, kRegionBytes, 2, s);
  std::printf("child_ordered_read_mismatches %lld\n", after);
  const long long rest = Mismatches(pool, kRegionBytes, bytes - 2 * kRegionBytes, 1, s);
  std::printf("child_pool_mismatches %lld\n", rest);
  // Bandwidth: 512 MiB out of the mapping vs the same copy between two local buffers.
  const size_t n = std::min<size_t>(512ull << 20, bytes - kRegionBytes);
  void* a = nullptr;
  void* b = nullptr;
  if (!CK(cudaMalloc(&a, n)) || !CK(cudaMalloc(&b, n))) return 1;
  std::printf("child_ipc_copy_gbps %.1f\n", CopyGbps(a, pool, n));
  std::printf("child_local_copy_gbps %.1f\n", CopyGbps(a, b, n));
  cudaFree(a);
  cudaFree(b);
  // A write the parent verifies: the mapping is read-write (the service would hand out a
  // read-only contract, which CUDA IPC cannot enforce: worth knowing).
  FillRange(pool, bytes - kRegionBytes, kRegionBytes, 3);
  if (!CK(cudaDeviceSynchronize())) return 1;
  const auto t2 = std::chrono::steady_clock::now();
  if (!CK(cudaIpcCloseMemHandle(pool))) return 1;
  std::printf("child_close_ms %.3f\n", Ms(t2));
  cudaEventDestroy(ev);
  return before >= 0 && after == 0 && rest == 0 ? 0 : 1;
}

int ChildVmm(int fd, size_t size) {
  if (!CK(cudaSetDevice(0)) || !CK(cudaFree(nullptr))) return 1;
  Vmm v;
  if (!v.Load()) return 1;
  CUmemGenericAllocationHandle h = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!DK(v.import_handle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))) {
    return 1;
  }
  const CUdeviceptr p = MapVmm(v, h, size);
  if (p == 0) return 1;
  std::printf("child_vmm_import_map_ms %.3f\n", Ms(t0));
  cudaStream_t s;
  if (!CK(cudaStreamCreate(&s))) return 1;
  const long long bad = Mismatches(reinterpret_cast<void*>(p), 0, size, 4, s);
  std::printf("child_vmm_mismatches %lld\n", bad);
  const size_t n = std::min<size_t>(512ull << 20, size);
  void* a = nullptr;
  if (!CK(cudaMalloc(&a, n))) return 1;
  std::printf("child_vmm_copy_gbps %.1f\n", CopyGbps(a, reinterpret_cast<void*>(p), n));
  cudaFree(a);
  FillRange(reinterpret_cast<void*>(p), 0, kRegionBytes, 5);
  if (!CK(cudaDeviceSynchronize())) return 1;
  DK(v.unmap(p, size));
  DK(v.address_free(p, size));
  DK(v.release(h));
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--child-legacy") == 0 && argc == 5) {
    return ChildLegacy(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10));
  }
  if (argc >= 2 && std::strcmp(argv[1], "--child-vmm") == 0 && argc == 4) {
    return ChildVmm(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  }
  size_t mib = 2048;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--json FILE]\n", argv[0]);
      return 64;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
    if (json) {
      if (FILE* f = std::fopen(json, "w")) {
        std::fprintf(f, "{\"skipped\": \"no CUDA device\"}\n");
        std::fclose(f);
      }
    }
    return 0;
  }
  const size_t bytes = std::max<size_t>(mib, 256) << 20;
  std::fflush(stdout);
  bool ok = CK(cudaSetDevice(0));
  std::vector<std::string> facts;

  // ---- legacy cudaIpc
  void* pool = nullptr;
  ok = ok && CK(cudaMalloc(&pool, bytes));
  if (ok) {
    FillRange(pool, 0, bytes, 1);
    ok = CK(cudaDeviceSynchronize());
  }
  cudaIpcMemHandle_t mh{};
  cudaIpcEventHandle_t eh{};
  cudaEvent_t ev{};
  cudaStream_t s{};
  ok = ok && CK(cudaIpcGetMemHandle(&mh, pool)) &&
       CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess)) &&
       CK(cudaIpcGetEventHandle(&eh, ev)) &&
       CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Opening one's own handle: the simulator must answer as the real runtime does.
  if (ok) {
    void* self = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&self, mh, cudaIpcMemLazyEnablePeerAccess);
    cudaGetLastError();
    std::printf("same_process_open %s\n", e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e));
    if (e == cudaSuccess) cudaIpcCloseMemHandle(self);
  }
  if (ok) {
    // The slow rewrite of region 0 (seed 2), the event after it; the child starts meanwhile.
    SlowFill<<<1024, 256, 0, s>>>(static_cast<uint32_t*>(pool), kRegionBytes / 4, 0, 2,
                                  1500000000ull);
    ok = CK(cudaGetLastError()) && CK(cudaEventRecord(ev, s));
    std::fflush(stdout);
    const int rc = ok ? Spawn({argv[0], "--child-legacy", Hex(&mh, sizeof(mh)),
                               Hex(&eh, sizeof(eh)), std::to_string(bytes)})
                      : -1;
    std::printf("legacy_child_exit %d\n", rc);
    ok = ok && rc == 0 && CK(cudaStreamSynchronize(s));
    const long long w = ok ? Mismatches(pool, bytes - kRegionBytes, kRegionBytes, 3, s) : -1;
    std::printf("parent_sees_child_write_mismatches %lld\n", w);
    ok = ok && w == 0;
  }
  std::printf("legacy_ipc %s\n", ok ? "PASS" : "FAIL");
  if (pool) cudaFree(pool);
  bool all = ok;

  // ---- VMM + POSIX fd
  Vmm v;
  bool vok = v.Load();
  CUmemGenericAllocationHandle h = 0;
  size_t gran = 0;
  CUmemAllocationProp prop = PosixFdProp();
  vok = vok && DK(v.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t vsize = gran ? (std::min<size_t>(bytes, 1ull << 30) + gran - 1) / gran * gran : 0;
  vok = vok && DK(v.create(&h, vsize, &prop, 0));
  const CUdeviceptr p = vok ? MapVmm(v, h, vsize) : 0;
  vok = vok && p != 0;
  int fd = -1;
  if (vok) {
    FillRange(reinterpret_cast<void*>(p), 0, vsize, 4);
    vok = CK(cudaDeviceSynchronize()) &&
          DK(v.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
  if (vok) {
    std::printf("vmm_granularity %zu\n", gran);
    std::fflush(stdout);
    // dup(): the exported fd may be close-on-exec; the copy is not, so the child inherits it.
    const int child_fd = dup(fd);
    const int rc = Spawn({argv[0], "--child-vmm", std::to_string(child_fd), std::to_string(vsize)});
    if (child_fd >= 0) close(child_fd);
    std::printf("vmm_child_exit %d\n", rc);
    vok = rc == 0;
    const long long w = vok ? Mismatches(reinterpret_cast<void*>(p), 0, kRegionBytes, 5, s) : -1;
    std::printf("parent_sees_vmm_child_write_mismatches %lld\n", w);
    vok = vok && w == 0;
  }
  if (fd >= 0) close(fd);
  if (p) {
    DK(v.unmap(p, vsize));
    DK(v.address_free(p, vsize));
  }
  if (h) DK(v.release(h));
  std::printf("vmm_posix_fd %s\n", vok ? "PASS" : "FAIL");
  all = all && vok;
  std::printf("kvc_cuda_ipc_probe: %s\n", all ? "PASS" : "FAIL");
  if (json) {
    if (FILE* f = std::fopen(json, "w")) {
      std::fprintf(f, "{\"legacy_ipc\": %s, \"vmm_posix_fd\": %s, \"pool_bytes\": %zu}\n",
                   ok ? "true" : "false", vok ? "true" : "false", bytes);
      std::fclose(f);
    }
  }
  return all ? 0 : 1;
}
