// cudasim's scheduler: launches, fibers and their x86-64 context switch, barriers, warp
// collectives, and the execution of a grid.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cuda_runtime.h"
#include "cudasim_internal.h"

#if !defined(__x86_64__)
#error "cudasim's context switch is x86-64 only"
#endif

// Under ThreadSanitizer each fiber is a TSan fiber, switched to before each stack switch
// (with synchronization: fibers of a block never run at once). What TSan checks is then the
// simulator's own host threads: queues, registry, device lock.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define KVC_SIM_TSAN 1
#else
#define KVC_SIM_TSAN 0
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

using internal::DeviceMutex;
using internal::Enqueue;
using internal::Fail;
using internal::Resolve;
using internal::t_executing;
using internal::t_last_error;

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

struct SharedVarSlot {
  void* addr;
  size_t bytes;
  uint64_t block;  // the block (counter) in which it was last poisoned
};

Order OrderFromEnv() {
  const char* v = std::getenv("KVC_CUDASIM_ORDER");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "forward") == 0) return Order::kForward;
  if (std::strcmp(v, "reverse") == 0) return Order::kReverse;
  if (std::strcmp(v, "shuffle") == 0) return Order::kShuffle;
  std::fprintf(stderr, "cudasim: KVC_CUDASIM_ORDER=%s is not forward, reverse or shuffle\n", v);
  std::abort();
}
uint64_t SeedFromEnv() {
  const char* v = std::getenv("KVC_CUDASIM_SEED");
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 0) : 20240607u;
}

// The scheduler's state; touched only under the device lock.
struct Sim {
  cudaError_t exec_error = cudaSuccess;  // of the grid being run
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<void*> tsan_fibers;  // one per stack (ThreadSanitizer builds)
  void* tsan_scheduler = nullptr;  // the executing host thread's own
  std::vector<Fiber> fibers;
  std::vector<int> resume_order;
  std::vector<unsigned char> dynamic_shared;
  std::vector<SharedVarSlot> shared_vars;
  uint64_t block_counter = 0;
  void* scheduler_sp = nullptr;
  const void* scheduler_stack = nullptr;  // bottom and size (for ASan's fiber switches)
  size_t scheduler_stack_size = 0;
  int current = -1;
  int live = 0;
  const std::function<void()>* body = nullptr;
  // reverse: the highest block and thread first; shuffle: a random permutation of the
  // blocks of each grid and of the threads of each block. A read of another thread's or
  // block's write that lacks a barrier (or that no order guarantees) is then seen in one
  // order or the other.
  Order order = OrderFromEnv();
  std::mt19937_64 rng{SeedFromEnv()};
};
// A plain global (not a function static): S() is called at every fiber switch, and only
// by device work, never during static initialization.
Sim g_sim;
inline Sim& S() { return g_sim; }

// The dynamic shared memory attribute of each kernel (set by host threads at any time).
struct FuncAttrs {
  std::mutex mu;
  std::map<const void*, int> max_dynamic_shared;
};
FuncAttrs& Attrs() {
  static FuncAttrs a;
  return a;
}

// ---------------------------------------------------------------------------------------
// The fiber scheduler.

// Fiber -> scheduler, and back when the scheduler resumes this fiber.
void SwitchTsan(void* to) {
#if KVC_SIM_TSAN
  __tsan_switch_to_fiber(to, 0);
#else
  (void)to;
#endif
}

void Yield() {
  Sim& s = S();
  SwitchTsan(s.tsan_scheduler);
  KVC_SIM_START_SWITCH(s.scheduler_stack, s.scheduler_stack_size);
  kvc_sim_switch(&s.fibers[s.current].sp, s.scheduler_sp);
  KVC_SIM_FINISH_SWITCH(&s.scheduler_stack, &s.scheduler_stack_size);
}

[[noreturn]] void FiberEntry() {
  Sim& s = S();
  KVC_SIM_FINISH_SWITCH(&s.scheduler_stack, &s.scheduler_stack_size);
  (*s.body)();
  s.fibers[s.current].state = State::kExited;
  --s.live;
  SwitchTsan(s.tsan_scheduler);
  KVC_SIM_START_SWITCH(s.scheduler_stack, s.scheduler_stack_size);
  kvc_sim_switch(&s.fibers[s.current].sp, s.scheduler_sp);
  std::abort();  // an exited fiber is never resumed
}

// Scheduler -> fiber i, and back when it waits or exits.
void Resume(int i) {
  Sim& s = S();
  s.current = i;
  thread_idx = s.fibers[i].idx;
  SwitchTsan(s.tsan_fibers.empty() ? nullptr : s.tsan_fibers[i]);
  KVC_SIM_START_SWITCH(s.stacks[i].get(), kStackBytes);
  kvc_sim_switch(&s.scheduler_sp, s.fibers[i].sp);
  KVC_SIM_FINISH_SWITCH(nullptr, nullptr);
}

void StartFiber(Fiber& f, char* stack) {
  // Top of stack: FiberEntry's address where kvc_sim_switch's `ret` finds it (16-byte
  // aligned slot, so FiberEntry starts as if called), under six zeroed saved registers.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
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
    for (int i : s.resume_order) {
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

// Runs a queued grid (device lock held, device memory open); returns its execution error.
cudaError_t RunGrid(const Cfg& cfg, const std::function<void()>& body) {
  Sim& s = S();
  const uint64_t threads = uint64_t{cfg.block.x} * cfg.block.y * cfg.block.z;
  while (s.stacks.size() < threads) {
    s.stacks.emplace_back(new char[kStackBytes]);
#if KVC_SIM_TSAN
    s.tsan_fibers.push_back(__tsan_create_fiber(0));
#endif
  }
#if KVC_SIM_TSAN
  s.tsan_scheduler = __tsan_get_current_fiber();
#endif
  s.dynamic_shared.assign(cfg.smem + 16, 0xff);
  s.body = &body;
  s.exec_error = cudaSuccess;
  grid_dim = cfg.grid;
  block_dim = cfg.block;
  const uint64_t blocks = uint64_t{cfg.grid.x} * cfg.grid.y * cfg.grid.z;
  std::vector<uint64_t> block_order;
  if (s.order == Order::kShuffle) {
    block_order.resize(blocks);
    std::iota(block_order.begin(), block_order.end(), uint64_t{0});
    std::shuffle(block_order.begin(), block_order.end(), s.rng);
  }
  s.resume_order.resize(threads);
  std::iota(s.resume_order.begin(), s.resume_order.end(), 0);
  if (s.order == Order::kReverse) std::reverse(s.resume_order.begin(), s.resume_order.end());
  for (uint64_t k = 0; k < blocks && s.exec_error == cudaSuccess; ++k) {
    const uint64_t b = s.order == Order::kShuffle   ? block_order[k]
                       : s.order == Order::kReverse ? blocks - 1 - k
                                                    : k;
    block_idx = uint3{static_cast<unsigned>(b % cfg.grid.x),
                      static_cast<unsigned>(b / cfg.grid.x % cfg.grid.y),
                      static_cast<unsigned>(b / (uint64_t{cfg.grid.x} * cfg.grid.y))};
    ++s.block_counter;  // static __shared__ variables are poisoned again (SharedVar)
    std::memset(s.dynamic_shared.data(), 0xff, s.dynamic_shared.size());  // NaN floats
    if (s.order == Order::kShuffle)
      std::shuffle(s.resume_order.begin(), s.resume_order.end(), s.rng);
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
  s.body = nullptr;
  return s.exec_error;
}

}  // namespace

void SetError(cudaError_t e, const char* what) {
  if (t_executing) {
    Sim& s = S();
    if (s.exec_error != cudaSuccess) return;
    s.exec_error = e;
  } else {
    if (t_last_error != cudaSuccess) return;
    t_last_error = e;
  }
  std::fprintf(stderr, "cudasim: %s\n", what);
}

cudaError_t SetFuncMaxDynamicShared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > 227 * 1024) return Fail(cudaErrorInvalidValue);
  FuncAttrs& a = Attrs();
  std::lock_guard<std::mutex> lock(a.mu);
  a.max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

void* DynamicSharedBase() { return S().dynamic_shared.data(); }

void SharedVar(void* addr, size_t bytes) {
  Sim& s = S();
  for (SharedVarSlot& v : s.shared_vars) {
    if (v.addr != addr) continue;
    if (v.block != s.block_counter) std::memset(addr, 0xff, bytes), v.block = s.block_counter;
    return;
  }
  std::memset(addr, 0xff, bytes);
  s.shared_vars.push_back(SharedVarSlot{addr, bytes, s.block_counter});
}

void SetOrder(Order order, uint64_t seed) {
  std::lock_guard<std::mutex> device(DeviceMutex());
  S().order = order;
  S().rng.seed(seed);
}

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
  return WarpOp(mask, mine, src, /*pred=*/false);
}
unsigned WarpBallot(unsigned mask, bool pred) {
  return static_cast<unsigned>(WarpOp(mask, 0, -1, pred));
}

void Launch(const void* kernel, const Cfg& cfg, std::function<void()> body) {
  if (t_executing) return SetError(cudaErrorLaunchFailure, "launch from inside a kernel");
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
  size_t limit = size_t{48} * 1024;
  {
    FuncAttrs& a = Attrs();
    std::lock_guard<std::mutex> lock(a.mu);
    const auto attr = a.max_dynamic_shared.find(kernel);
    if (attr != a.max_dynamic_shared.end()) limit = static_cast<size_t>(attr->second);
  }
  if (cfg.smem > limit) {
    char what[160];
    std::snprintf(what, sizeof what,
                  "launch asks for %zu bytes of dynamic shared memory; the kernel allows %zu "
                  "(cudaFuncSetAttribute)",
                  cfg.smem, limit);
    return SetError(cudaErrorInvalidValue, what);
  }
  CUstream_st* s = nullptr;
  if (Resolve(cfg.stream, &s) != cudaSuccess)
    return SetError(cudaErrorInvalidResourceHandle, "launch on a destroyed or unknown stream");
  Enqueue(s, [cfg, body = std::move(body)] { return RunGrid(cfg, body); });
}

}  // namespace kvc_sim
