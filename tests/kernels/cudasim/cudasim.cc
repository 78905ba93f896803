// cudasim's scheduler and runtime (see cuda_runtime.h): work queued per stream runs at
// synchronization points under one device lock, with device memory opened (mprotect) only
// then; blocks run one after another, the threads of a block are fibers switched by a small
// x86-64 context switch at barriers and warp collectives.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_runtime.h"

#if !defined(__x86_64__)
#error "cudasim's context switch is x86-64 only"
#endif

// Under AddressSanitizer every switch is announced, so that ASan checks the kernels' memory
// accesses (device buffers, shared memory, per-thread arrays) on the fiber stacks too.
// Device allocations are mmap'd, so the slack around each is poisoned by hand.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KVC_SIM_START_SWITCH(bottom, size) __sanitizer_start_switch_fiber(nullptr, bottom, size)
#define KVC_SIM_FINISH_SWITCH(bottom, size) __sanitizer_finish_switch_fiber(nullptr, bottom, size)
#define KVC_SIM_POISON(addr, size) __asan_poison_memory_region(reinterpret_cast<void*>(addr), size)
#define KVC_SIM_UNPOISON(addr, size) \
  __asan_unpoison_memory_region(reinterpret_cast<void*>(addr), size)
#else
#define KVC_SIM_START_SWITCH(bottom, size) ((void)(bottom), (void)(size))
#define KVC_SIM_FINISH_SWITCH(bottom, size) ((void)(bottom), (void)(size))
#define KVC_SIM_POISON(addr, size) ((void)(addr), (void)(size))
#define KVC_SIM_UNPOISON(addr, size) ((void)(addr), (void)(size))
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

// One queued piece of device work: a grid, a copy, a memset, a stream-ordered free. It
// returns the error of its execution (reported by the call that synchronizes its stream).
struct SimItem {
  uint64_t seq = 0;
  std::function<cudaError_t()> run;
};

// A stream. `flags` is set before the stream is published; the rest is guarded by the
// queues' mutex (Queues::mu below).
struct CUstream_st {
  unsigned flags = cudaStreamDefault;
  std::deque<SimItem> queue;
  int in_flight = 0;
  cudaError_t error = cudaSuccess;  // first execution error since the last synchronization
};

namespace kvc_sim {

uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;

// ---------------------------------------------------------------------------------------
// Errors. CUDA's last error is per host thread; errors raised while device work executes
// belong to that work's stream instead (CUDA reports them from a later synchronizing call).

thread_local cudaError_t t_last_error = cudaSuccess;
// This thread is executing device work (it holds the device lock): SetError goes to exec.
thread_local bool t_executing = false;

cudaError_t Fail(cudaError_t e) {
  if (t_last_error == cudaSuccess) t_last_error = e;
  return e;
}

// ---------------------------------------------------------------------------------------
// The simulated GPU: one lock under which all device work executes, one item at a time.

std::mutex& DeviceMutex() {
  static std::mutex mu;
  return mu;
}

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
// Memory. Each device allocation is its own mapping: its pages, PROT_NONE except while
// device work executes, between two guard pages that are never opened, with the allocation
// placed at the end of its pages (256-byte aligned, as cudaMalloc's) so that a kernel that
// runs past it faults; under AddressSanitizer the slack around it is poisoned too, so that
// any byte outside it is reported. Pinned host memory is registered (for
// cudaPointerGetAttributes and the copy rules) and always accessible.

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

struct Region {
  size_t bytes;        // as asked: what copies, memsets and kernels may touch
  uintptr_t map_base;  // the mapping (guard pages included)
  size_t mapped;
  uintptr_t pages;  // the pages opened while device work runs (device)
  size_t opened;
  bool device;
};

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Region> regions;  // by the address handed out
  size_t capacity = [] {
    const char* v = std::getenv("KVC_CUDASIM_DEVICE_BYTES");
    return v != nullptr && *v != '\0' ? static_cast<size_t>(std::strtoull(v, nullptr, 0))
                                      : size_t{8} << 30;
  }();
  size_t used = 0;    // device pages allocated
  bool open = false;  // device work is executing: device regions are readable and writable
};
Memory& Mem() {
  static Memory m;
  return m;
}

void Protect(uintptr_t base, size_t bytes, int prot) {
  if (bytes == 0) return;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  if (mprotect(reinterpret_cast<void*>(base), bytes, prot) != 0) {
    std::fprintf(stderr, "cudasim: mprotect failed (errno %d)\n", errno);
    std::abort();
  }
}

// Opens (or closes) every device region; called with the device lock held.
void SetDeviceAccess(bool open) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  for (const auto& [base, r] : m.regions)
    if (r.device) Protect(r.pages, r.opened, open ? PROT_READ | PROT_WRITE : PROT_NONE);
  m.open = open;
}

// The region holding `a` among [p, p + bytes) ranges (nullptr if none); m.mu held.
const Region* FindLocked(Memory& m, uintptr_t a, uintptr_t* key) {
  auto it = m.regions.upper_bound(a);
  if (it == m.regions.begin()) return nullptr;
  --it;
  if (a - it->first >= it->second.bytes) return nullptr;
  *key = it->first;
  return &it->second;
}

// SIGSEGV with a diagnosis, for faults at device allocations: host code touching device
// memory outside device work, or device work past an allocation's end. Installed only where
// nothing else handles SIGSEGV (AddressSanitizer reports those faults itself).
void OnSegv(int, siginfo_t* info, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  Memory& m = Mem();
  char msg[300];
  int n = 0;
  if (m.mu.try_lock()) {
    for (const auto& [key, r] : m.regions) {
      if (!r.device || a < r.map_base || a - r.map_base >= r.mapped) continue;
      if (a - key < r.bytes && !t_executing) {
        n = std::snprintf(msg, sizeof msg,
                          "cudasim: host code accessed device memory at %p (byte %zu of a "
                          "%zu-byte device allocation) outside device work\n",
                          info->si_addr, static_cast<size_t>(a - key), r.bytes);
      } else {
        n = std::snprintf(
            msg, sizeof msg,
            "cudasim: %s accessed %p, outside the %zu-byte device allocation at "
            "%p (a guard page)\n",
            t_executing ? "device work" : "host code", info->si_addr, r.bytes,
            // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
            reinterpret_cast<void*>(key));
      }
      break;
    }
    m.mu.unlock();
  }
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(n) < sizeof msg ? n : sizeof msg - 1);
  signal(SIGSEGV, SIG_DFL);  // the faulting access runs again and kills the process
}
void InstallSegvHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGSEGV, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;
    struct sigaction sa {};
    sa.sa_sigaction = OnSegv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
  });
}

cudaError_t MapRegion(void** p, size_t bytes, bool device) {
  *p = nullptr;
  if (device) InstallSegvHandler();
  Memory& m = Mem();
  const size_t page = PageBytes();
  if (bytes == 0) bytes = 1;
  const size_t opened = RoundUp(bytes, page);
  const size_t mapped = opened + (device ? 2 * page : 0);
  std::lock_guard<std::mutex> lock(m.mu);
  if (device && opened > m.capacity - m.used) return cudaErrorMemoryAllocation;
  void* base = mmap(nullptr, mapped, device ? PROT_NONE : PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return cudaErrorMemoryAllocation;
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  const uintptr_t pages = device ? b + page : b;
  const uintptr_t user = device ? pages + opened - RoundUp(bytes, 256) : b;
  KVC_SIM_POISON(pages, user - pages);
  KVC_SIM_POISON(user + bytes, pages + opened - (user + bytes));
  // A region mapped while another thread's device work runs must be usable by it at once.
  if (device && m.open) Protect(pages, opened, PROT_READ | PROT_WRITE);
  m.regions[user] = Region{bytes, b, mapped, pages, opened, device};
  if (device) m.used += opened;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  *p = reinterpret_cast<void*>(user);  // NOLINT(performance-no-int-to-ptr): the sim's own mappings
  return cudaSuccess;
}

cudaError_t UnmapRegion(void* p, bool device) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const auto it = m.regions.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.regions.end() || it->second.device != device) return cudaErrorInvalidValue;
  const Region& r = it->second;
  KVC_SIM_UNPOISON(r.pages, r.opened);  // the next mapping here starts clean
  // NOLINTNEXTLINE(performance-no-int-to-ptr): addresses of the sim's own mappings
  munmap(reinterpret_cast<void*>(r.map_base), r.mapped);
  if (device) m.used -= r.opened;
  m.regions.erase(it);
  return cudaSuccess;
}

enum class Kind { kPageable, kPinned, kDevice };
// What [p, p + bytes) is: inside one device allocation, pinned host memory, or other host
// memory. A range that starts in a device allocation and runs past its end is invalid.
bool Classify(const void* p, size_t bytes, Kind* kind) {
  Memory& m = Mem();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(m.mu);
  uintptr_t key = 0;
  const Region* r = FindLocked(m, a, &key);
  if (r == nullptr) return *kind = Kind::kPageable, true;
  *kind = r->device ? Kind::kDevice : Kind::kPinned;
  return a - key + bytes <= r->bytes;
}

// ---------------------------------------------------------------------------------------
// Streams: FIFO queues of device work, run only when something synchronizes.

struct Queues {
  std::mutex mu;
  uint64_t next_seq = 1;
  CUstream_st legacy;  // the legacy default stream (nullptr)
  std::set<CUstream_st*> live{&legacy};
};
Queues& Q() {
  static Queues q;
  return q;
}

bool Blocking(const CUstream_st* s) { return (s->flags & cudaStreamNonBlocking) == 0; }

// nullptr is the legacy default stream; a destroyed or made-up handle is an error.
cudaError_t Resolve(cudaStream_t s, CUstream_st** out) {
  Queues& q = Q();
  std::lock_guard<std::mutex> lock(q.mu);
  *out = s == nullptr ? &q.legacy : s;
  return q.live.count(*out) != 0 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

void Enqueue(CUstream_st* s, std::function<cudaError_t()> run) {
  Queues& q = Q();
  std::lock_guard<std::mutex> lock(q.mu);
  s->queue.push_back(SimItem{q.next_seq++, std::move(run)});
}

// Runs, in enqueue order, the queued work that synchronizing `target` (nullptr: the whole
// device) must wait for, as of now. Legacy default stream semantics: the legacy stream and
// blocking streams wait for each other's earlier work; non-blocking streams for nothing but
// their own. With `report`, returns (and clears) the first execution error recorded for
// `target` (every stream for nullptr); else errors stay for the stream's next
// synchronization. Called with the device lock held, so nothing else executes meanwhile.
cudaError_t DrainLocked(CUstream_st* target, bool report) {
  Queues& q = Q();
  uint64_t limit = 0, legacy_limit = 0;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (target == nullptr) {
      limit = q.next_seq;
    } else if (!target->queue.empty()) {
      limit = target->queue.back().seq + 1;
      if (Blocking(target)) {
        for (auto it = q.legacy.queue.rbegin(); it != q.legacy.queue.rend(); ++it) {
          if (it->seq < limit) {
            legacy_limit = it->seq;
            break;
          }
        }
      }
    }
  }
  // Whether `s`'s item `seq` is among the work waited for.
  auto needed = [&](CUstream_st* s, uint64_t seq) {
    if (target == nullptr) return seq < limit;
    if (s == target) return seq < limit;
    if (!Blocking(target) || !Blocking(s)) return false;
    return s == &q.legacy ? seq < limit : seq < legacy_limit;
  };
  bool opened = false;
  for (;;) {
    CUstream_st* from = nullptr;
    SimItem item;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      for (CUstream_st* s : q.live) {
        if (s->queue.empty() || !needed(s, s->queue.front().seq)) continue;
        if (from == nullptr || s->queue.front().seq < from->queue.front().seq) from = s;
      }
      if (from == nullptr) break;
      item = std::move(from->queue.front());
      from->queue.pop_front();
      ++from->in_flight;
    }
    if (!opened) SetDeviceAccess(true), opened = true;
    t_executing = true;
    const cudaError_t e = item.run();
    t_executing = false;
    std::lock_guard<std::mutex> lock(q.mu);
    --from->in_flight;
    if (e != cudaSuccess && from->error == cudaSuccess) from->error = e;
  }
  if (opened) SetDeviceAccess(false);
  if (!report) return cudaSuccess;
  std::lock_guard<std::mutex> lock(q.mu);
  cudaError_t e = cudaSuccess;
  for (CUstream_st* s : q.live) {
    if (target != nullptr && s != target) continue;
    if (e == cudaSuccess) e = s->error;
    s->error = cudaSuccess;
  }
  return e;
}

cudaError_t Drain(CUstream_st* target, bool report) {
  std::lock_guard<std::mutex> device(DeviceMutex());
  return DrainLocked(target, report);
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

using kvc_sim::Fail;
using kvc_sim::Kind;

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
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle (cudasim)";
    case cudaErrorNotReady:
      return "device not ready (cudasim)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (cudasim)";
  }
  return "unknown error (cudasim)";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = kvc_sim::t_last_error;
  kvc_sim::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return kvc_sim::t_last_error; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "cudasim (host)");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = kvc_sim::Mem().capacity;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  if (attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return Fail(cudaErrorInvalidValue);
  *value = 227 * 1024;  // sm_90
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  kvc_sim::Memory& m = kvc_sim::Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *free_bytes = m.capacity - m.used;
  *total_bytes = m.capacity;
  return cudaSuccess;
}

// Fresh device memory reads as zeros (new pages); cudaMallocAsync's as 0xff garbage.
cudaError_t cudaMalloc(void** p, size_t bytes) {
  return Fail(kvc_sim::MapRegion(p, bytes, /*device=*/true));
}
// CUDA's cudaFree waits for the device to be idle: queued work that still uses the memory
// runs first.
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> device(kvc_sim::DeviceMutex());
  kvc_sim::DrainLocked(/*target=*/nullptr, /*report=*/false);
  return Fail(kvc_sim::UnmapRegion(p, /*device=*/true));
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  const cudaError_t e = kvc_sim::MapRegion(p, bytes, /*device=*/true);
  if (e != cudaSuccess) return Fail(e);
  void* q = *p;
  kvc_sim::Enqueue(s, [q, bytes] {  // fresh scratch is garbage on a device too
    std::memset(q, 0xff, bytes);
    return cudaSuccess;
  });
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  kvc_sim::Enqueue(s, [p] { return kvc_sim::UnmapRegion(p, /*device=*/true); });
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return Fail(kvc_sim::MapRegion(p, bytes, /*device=*/false));
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  if (flags != cudaHostAllocDefault) return Fail(cudaErrorInvalidValue);  // not modelled
  return cudaMallocHost(p, bytes);
}
// Like cudaFree, waits for queued work (which may still copy from or to it).
cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> device(kvc_sim::DeviceMutex());
  kvc_sim::DrainLocked(/*target=*/nullptr, /*report=*/false);
  return Fail(kvc_sim::UnmapRegion(p, /*device=*/false));
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return Fail(cudaErrorInvalidValue);
  Kind kind = Kind::kPageable;
  kvc_sim::Classify(p, 0, &kind);
  void* q = const_cast<void*>(p);
  switch (kind) {
    case Kind::kDevice:
      *attr = cudaPointerAttributes{cudaMemoryTypeDevice, 0, q, nullptr};
      break;
    case Kind::kPinned:
      *attr = cudaPointerAttributes{cudaMemoryTypeHost, 0, q, q};
      break;
    case Kind::kPageable:
      *attr = cudaPointerAttributes{cudaMemoryTypeUnregistered, cudaInvalidDeviceId, nullptr, q};
      break;
  }
  return cudaSuccess;
}

// Queues a copy on `stream`. Pageable host sources are staged now (CUDA copies them before
// the call returns); pinned sources and every destination are accessed when the copy
// executes, so a host that reuses a pinned buffer, or reads a result, before synchronizing
// sees what a GPU could give it.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  Kind dk, sk;
  if (!kvc_sim::Classify(dst, bytes, &dk) || !kvc_sim::Classify(src, bytes, &sk))
    return Fail(cudaErrorInvalidValue);  // runs past the end of a device allocation
  const bool dd = dk == Kind::kDevice, sd = sk == Kind::kDevice;
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToHost && !dd && !sd) ||
                  (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                  (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
                  (kind == cudaMemcpyDeviceToDevice && dd && sd);
  if (!ok) return Fail(cudaErrorInvalidValue);
  if (sk == Kind::kPageable) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    kvc_sim::Enqueue(s, [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return cudaSuccess;
    });
  } else {
    kvc_sim::Enqueue(s, [dst, src, bytes] {
      std::memmove(dst, src, bytes);
      return cudaSuccess;
    });
  }
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  Kind kind;
  if (!kvc_sim::Classify(p, bytes, &kind) || kind != Kind::kDevice)
    return Fail(cudaErrorInvalidValue);
  kvc_sim::Enqueue(s, [p, value, bytes] {
    std::memset(p, value, bytes);
    return cudaSuccess;
  });
  return cudaSuccess;
}
// The blocking forms run on the legacy default stream and wait for it (and so for all
// earlier work of blocking streams), returning earlier asynchronous errors as CUDA does.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, /*s=*/nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(p, value, bytes, /*s=*/nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  return Fail(kvc_sim::Drain(s, /*report=*/true));
}
cudaError_t cudaDeviceSynchronize() {
  return Fail(kvc_sim::Drain(/*target=*/nullptr, /*report=*/true));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return Fail(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->flags = flags;
  kvc_sim::Queues& q = kvc_sim::Q();
  std::lock_guard<std::mutex> lock(q.mu);
  q.live.insert(s);
  *stream = s;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
// CUDA lets queued work finish after the stream is destroyed; here it runs first.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (stream == nullptr || kvc_sim::Resolve(stream, &s) != cudaSuccess)
    return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> device(kvc_sim::DeviceMutex());
  kvc_sim::DrainLocked(s, /*report=*/false);
  kvc_sim::Queues& q = kvc_sim::Q();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    q.live.erase(s);
  }
  delete s;
  return cudaSuccess;
}
// A stream with queued work is "not ready" once, and its work runs then: a host that polls
// makes progress, and a single query never finds queued work already done.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = nullptr;
  if (kvc_sim::Resolve(stream, &s) != cudaSuccess) return Fail(cudaErrorInvalidResourceHandle);
  {
    kvc_sim::Queues& q = kvc_sim::Q();
    std::lock_guard<std::mutex> lock(q.mu);
    if (s->queue.empty() && s->in_flight == 0) {
      const cudaError_t e = s->error;
      s->error = cudaSuccess;
      return Fail(e);
    }
  }
  kvc_sim::Drain(s, /*report=*/false);
  return cudaErrorNotReady;
}
