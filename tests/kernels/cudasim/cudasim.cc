// cudasim's scheduler and runtime (see cuda_runtime.h): blocks run one after another, the
// threads of a block are fibers switched by a small x86-64 context switch at barriers and
// warp collectives.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#error "cudasim's context switch is x86-64 only"
#endif

// Under AddressSanitizer every switch is announced, so that ASan checks the kernels' memory
// accesses (device buffers, shared memory, per-thread arrays) on the fiber stacks too.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define KVC_SIM_START_SWITCH(bottom, size) __sanitizer_start_switch_fiber(nullptr, bottom, size)
#define KVC_SIM_FINISH_SWITCH(bottom, size) __sanitizer_finish_switch_fiber(nullptr, bottom, size)
#else
#define KVC_SIM_START_SWITCH(bottom, size) ((void)(bottom), (void)(size))
#define KVC_SIM_FINISH_SWITCH(bottom, size) ((void)(bottom), (void)(size))
#endif

// Saves the callee-saved registers on the current stack, stores the stack pointer in
// *from_sp, loads to_sp and restores the registers saved there.
extern "C" void kvc_sim_switch(void** from_sp, void* to_sp);
asm(R"(
  .text
  .globl kvc_sim_switch
  .type kvc_sim_switch, @function
kvc_sim_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kvc_sim_switch, .-kvc_sim_switch
)");

namespace kvc_sim {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;

enum class State { kRunnable, kBlockBarrier, kWarpOp, kExited };

struct Fiber {
  void* sp = nullptr;
  State state = State::kRunnable;
  uint3 idx{0, 0, 0};
  int lane = 0, warp = 0;
  unsigned mask = 0;  // warp op: lanes named
  uint64_t out = 0;   // value published for the current warp op
  int src = 0;        // lane whose value it reads
  uint64_t result = 0;
  bool pred = false;
};

struct Sim {
  cudaError_t error = cudaSuccess;
  std::string error_text;
  std::map<const void*, int> max_dynamic_shared;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<Fiber> fibers;
  std::vector<unsigned char> dynamic_shared;
  void* scheduler_sp = nullptr;
  const void* scheduler_stack = nullptr;  // bottom and size (for ASan's fiber switches)
  size_t scheduler_stack_size = 0;
  int current = -1;
  int live = 0;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  bool in_kernel = false;
  // KVC_CUDASIM_ORDER=reverse resumes the highest thread first: a read of another thread's
  // write that lacks a barrier is seen in one order or the other.
  bool reverse = [] {
    const char* v = std::getenv("KVC_CUDASIM_ORDER");
    return v != nullptr && std::strcmp(v, "reverse") == 0;
  }();
};
Sim& S() {
  static Sim sim;
  return sim;
}

// Fiber -> scheduler, and back when the scheduler resumes this fiber.
void Yield() {
  Sim& s = S();
  KVC_SIM_START_SWITCH(s.scheduler_stack, s.scheduler_stack_size);
  kvc_sim_switch(&s.fibers[s.current].sp, s.scheduler_sp);
  KVC_SIM_FINISH_SWITCH(&s.scheduler_stack, &s.scheduler_stack_size);
}

[[noreturn]] void FiberEntry() {
  Sim& s = S();
  KVC_SIM_FINISH_SWITCH(&s.scheduler_stack, &s.scheduler_stack_size);
  s.body(s.ctx);
  s.fibers[s.current].state = State::kExited;
  --s.live;
  KVC_SIM_START_SWITCH(s.scheduler_stack, s.scheduler_stack_size);
  kvc_sim_switch(&s.fibers[s.current].sp, s.scheduler_sp);
  std::abort();  // an exited fiber is never resumed
}

// Scheduler -> fiber i, and back when it waits or exits.
void Resume(int i) {
  Sim& s = S();
  s.current = i;
  thread_idx = s.fibers[i].idx;
  KVC_SIM_START_SWITCH(s.stacks[i].get(), kStackBytes);
  kvc_sim_switch(&s.scheduler_sp, s.fibers[i].sp);
  KVC_SIM_FINISH_SWITCH(nullptr, nullptr);
}

void StartFiber(Fiber& f, char* stack) {
  // Top of stack: FiberEntry's address where kvc_sim_switch's `ret` finds it (16-byte
  // aligned slot, so FiberEntry starts as if called), under six zeroed saved registers.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  void** ret_slot = reinterpret_cast<void**>(top - 16);
  *ret_slot = reinterpret_cast<void*>(&FiberEntry);
  void** sp = ret_slot - 6;
  for (int i = 0; i < 6; ++i) sp[i] = nullptr;
  f.sp = sp;
}

// Releases the warp op group of lane `lane` of warp `warp` if every named lane waits in an op
// with the same mask.
bool TryReleaseWarp(int first_fiber, int lanes_in_warp, unsigned mask) {
  Sim& s = S();
  for (int l = 0; l < 32; ++l) {
    if (!((mask >> l) & 1u)) continue;
    if (l >= lanes_in_warp) return false;
    const Fiber& f = s.fibers[first_fiber + l];
    if (f.state != State::kWarpOp || f.mask != mask) return false;
  }
  unsigned ballot = 0;
  for (int l = 0; l < lanes_in_warp; ++l)
    if (((mask >> l) & 1u) && s.fibers[first_fiber + l].pred) ballot |= 1u << l;
  for (int l = 0; l < lanes_in_warp; ++l) {
    if (!((mask >> l) & 1u)) continue;
    Fiber& f = s.fibers[first_fiber + l];
    if (f.src < 0) {  // ballot
      f.result = ballot;
    } else {
      const int src = f.src < lanes_in_warp && ((mask >> f.src) & 1u) ? f.src : l;
      f.result = s.fibers[first_fiber + src].out;
    }
    f.state = State::kRunnable;
  }
  return true;
}

uint64_t WarpOp(unsigned mask, uint64_t mine, int src, bool pred) {
  Sim& s = S();
  Fiber& f = s.fibers[s.current];
  if (!((mask >> f.lane) & 1u)) {
    SetError(cudaErrorLaunchFailure, "warp collective called by a lane not in its mask");
    return mine;
  }
  f.mask = mask;
  f.out = mine;
  f.src = src;
  f.pred = pred;
  f.state = State::kWarpOp;
  const int threads = static_cast<int>(s.fibers.size());
  const int first = f.warp * 32;
  TryReleaseWarp(first, threads - first < 32 ? threads - first : 32, mask);
  if (f.state != State::kRunnable) Yield();
  return S().fibers[S().current].result;
}

void RunBlock() {
  Sim& s = S();
  const int n = static_cast<int>(s.fibers.size());
  for (;;) {
    bool ran = false;
    for (int k = 0; k < n; ++k) {
      const int i = s.reverse ? n - 1 - k : k;
      if (s.fibers[i].state != State::kRunnable) continue;
      Resume(i);
      ran = true;
    }
    if (s.live == 0) return;
    // Block barrier: every live thread waits at __syncthreads.
    bool all_at_barrier = true;
    for (const Fiber& f : s.fibers)
      if (f.state != State::kExited && f.state != State::kBlockBarrier) all_at_barrier = false;
    if (all_at_barrier) {
      for (Fiber& f : s.fibers)
        if (f.state == State::kBlockBarrier) f.state = State::kRunnable;
      continue;
    }
    if (!ran) {
      int at_barrier = 0, in_warp_op = 0;
      for (const Fiber& f : s.fibers) {
        at_barrier += f.state == State::kBlockBarrier;
        in_warp_op += f.state == State::kWarpOp;
      }
      char what[200];
      std::snprintf(what, sizeof what,
                    "deadlock in block (%u,%u,%u): %d threads at __syncthreads, %d in warp "
                    "collectives whose named lanes never all arrive, %d exited",
                    block_idx.x, block_idx.y, block_idx.z, at_barrier, in_warp_op, n - s.live);
      SetError(cudaErrorLaunchFailure, what);
      return;  // the stuck fibers are abandoned with their stacks
    }
  }
}

}  // namespace

void SetError(cudaError_t e, const char* what) {
  Sim& s = S();
  if (s.error == cudaSuccess) {
    s.error = e;
    s.error_text = what;
    std::fprintf(stderr, "cudasim: %s\n", what);
  }
}

cudaError_t SetFuncMaxDynamicShared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > 227 * 1024) return cudaErrorInvalidValue;
  S().max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

void* DynamicSharedBase() { return S().dynamic_shared.data(); }

int LaneId() {
  Sim& s = S();
  return s.fibers[s.current].lane;
}

void SyncThreads() {
  Sim& s = S();
  s.fibers[s.current].state = State::kBlockBarrier;
  Yield();
}

uint64_t WarpExchange(unsigned mask, uint64_t mine, int src) {
  return WarpOp(mask, mine, src, false);
}
unsigned WarpBallot(unsigned mask, bool pred) {
  return static_cast<unsigned>(WarpOp(mask, 0, -1, pred));
}

void RunGrid(const void* kernel, const Cfg& cfg, void (*body)(void*), void* ctx) {
  Sim& s = S();
  if (s.in_kernel) return SetError(cudaErrorLaunchFailure, "launch from inside a kernel");
  const uint64_t threads = uint64_t{cfg.block.x} * cfg.block.y * cfg.block.z;
  if (threads == 0 || threads > kMaxThreads || cfg.block.z > 64 || cfg.grid.x == 0 ||
      cfg.grid.y == 0 || cfg.grid.z == 0 || cfg.grid.x > 2147483647u || cfg.grid.y > 65535 ||
      cfg.grid.z > 65535) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "invalid launch configuration: grid (%u,%u,%u) block (%u,%u,%u)", cfg.grid.x,
                  cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z);
    return SetError(cudaErrorInvalidConfiguration, what);
  }
  const auto attr = s.max_dynamic_shared.find(kernel);
  const size_t limit =
      attr != s.max_dynamic_shared.end() ? static_cast<size_t>(attr->second) : size_t{48} * 1024;
  if (cfg.smem > limit) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "launch asks for %zu bytes of dynamic shared memory; the kernel allows %zu "
                  "(cudaFuncSetAttribute)",
                  cfg.smem, limit);
    return SetError(cudaErrorInvalidValue, what);
  }
  while (s.stacks.size() < threads) s.stacks.emplace_back(new char[kStackBytes]);
  s.dynamic_shared.assign(cfg.smem + 16, 0xff);
  s.body = body;
  s.ctx = ctx;
  s.in_kernel = true;
  grid_dim = cfg.grid;
  block_dim = cfg.block;
  for (unsigned bz = 0; bz < cfg.grid.z; ++bz) {
    for (unsigned by = 0; by < cfg.grid.y; ++by) {
      for (unsigned bx = 0; bx < cfg.grid.x && s.error == cudaSuccess; ++bx) {
        block_idx = uint3{bx, by, bz};
        std::memset(s.dynamic_shared.data(), 0xff, s.dynamic_shared.size());  // NaN floats
        s.fibers.assign(threads, Fiber{});
        for (uint64_t t = 0; t < threads; ++t) {
          Fiber& f = s.fibers[t];
          f.idx = uint3{static_cast<unsigned>(t % cfg.block.x),
                        static_cast<unsigned>(t / cfg.block.x % cfg.block.y),
                        static_cast<unsigned>(t / (uint64_t{cfg.block.x} * cfg.block.y))};
          f.lane = static_cast<int>(t % 32);
          f.warp = static_cast<int>(t / 32);
          StartFiber(f, s.stacks[t].get());
        }
        s.live = static_cast<int>(threads);
        RunBlock();
      }
    }
  }
  s.in_kernel = false;
}

}  // namespace kvc_sim

using kvc_sim::S;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error (cudasim)";
    case cudaErrorInvalidValue:
      return "invalid argument (cudasim)";
    case cudaErrorMemoryAllocation:
      return "out of memory (cudasim)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument (cudasim)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (cudasim)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (cudasim)";
  }
  return "unknown error (cudasim)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = S().error;
  S().error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return S().error; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "cudasim (host)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{1} << 34;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return cudaErrorInvalidValue;
  *value = 227 * 1024;  // sm_90
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);  // fresh scratch is garbage on a device too
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes > 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
