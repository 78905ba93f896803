// cudasim's internals shared by its files: errors, the device lock, memory regions, streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "cuda_runtime.h"

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

namespace kvc_sim::internal {

// ---------------------------------------------------------------------------------------
// Errors. CUDA's last error is per host thread; errors raised while device work executes
// belong to that work's stream instead (CUDA reports them from a later synchronizing call).

extern thread_local cudaError_t t_last_error;
// This thread is executing device work (it holds the device lock): SetError goes to exec.
extern thread_local bool t_executing;

// Makes `e` the calling thread's last error (unless one is pending) and returns it.
cudaError_t Fail(cudaError_t e);

// ---------------------------------------------------------------------------------------
// The simulated GPU: one lock under which all device work executes, one item at a time
// (cudasim_streams.cc).
std::mutex& DeviceMutex();

// ---------------------------------------------------------------------------------------
// Memory (cudasim_memory.cc).

struct Region {
  size_t bytes;        // as asked: what copies, memsets and kernels may touch
  uintptr_t map_base;  // the mapping (guard pages included)
  size_t mapped;
  uintptr_t pages;  // the pages opened while device work runs (device)
  size_t opened;
  bool device;
  int memfd = -1;         // device allocations >= kIpcMinBytes: their pages' file (IPC)
  bool imported = false;  // mapped by cudaIpcOpenMemHandle (not counted in `used`)
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
Memory& Mem();

// Opens (or closes) every device region; called with the device lock held.
void SetDeviceAccess(bool open);
// Maps a device allocation (guard pages, capacity) or pinned host memory; *p is the
// address handed out.
cudaError_t MapRegion(void** p, size_t bytes, bool device);
// `imported` must match the region: cudaFree of an opened IPC handle is an error, as is
// cudaIpcCloseMemHandle of an allocation.
cudaError_t UnmapRegion(void* p, bool device, bool imported = false);
// CUDA IPC (see cuda_runtime.h).
constexpr size_t kIpcMinBytes = size_t{1} << 20;
cudaError_t IpcExport(void* p, cudaIpcMemHandle_t* handle);
cudaError_t IpcOpen(const cudaIpcMemHandle_t& handle, void** p);

enum class Kind { kPageable, kPinned, kDevice };
// What [p, p + bytes) is: inside one device allocation, pinned host memory, or other host
// memory. A range that starts in a device allocation and runs past its end is invalid.
bool Classify(const void* p, size_t bytes, Kind* kind);

// ---------------------------------------------------------------------------------------
// Streams: FIFO queues of device work, run only when something synchronizes
// (cudasim_streams.cc).

struct Queues {
  std::mutex mu;
  uint64_t next_seq = 1;
  CUstream_st legacy;  // the legacy default stream (nullptr)
  std::set<CUstream_st*> live{&legacy};
};
Queues& Q();

// nullptr is the legacy default stream; a destroyed or made-up handle is an error.
cudaError_t Resolve(cudaStream_t s, CUstream_st** out);
void Enqueue(CUstream_st* s, std::function<cudaError_t()> run);
// Runs, in enqueue order, the queued work that synchronizing `target` (nullptr: the whole
// device) must wait for, as of now. Legacy default stream semantics: the legacy stream and
// blocking streams wait for each other's earlier work; non-blocking streams for nothing but
// their own. With `report`, returns (and clears) the first execution error recorded for
// `target` (every stream for nullptr); else errors stay for the stream's next
// synchronization. Called with the device lock held, so nothing else executes meanwhile.
cudaError_t DrainLocked(CUstream_st* target, bool report);
// DrainLocked under the device lock.
cudaError_t Drain(CUstream_st* target, bool report);

}  // namespace kvc_sim::internal
