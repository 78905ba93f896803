// Staging of kernel-op arguments for pools in device memory.
//
// Pool memory is reached only through kernel ops, but an op's other arguments (block lists,
// positions, queries, the dense K/V of an Append, the outputs of a Fetch) live in host memory
// the core owns. A device backend cannot read those. A StagingContext is what one core step
// needs to run ops on a device: its own stream (steps on different sequences run
// concurrently), a bump allocator of device scratch, and one of page-locked host memory through
// which inputs go to the device and outputs come back with asynchronous copies. A StagingPool
// keeps idle contexts of one backend for reuse, so a step costs no cudaMalloc or stream
// creation once the pool is warm.
//
// Scratch lives outside the pool's capacity_bytes: it is sized by one step's arguments (one
// Append, one Fetch chunk, one layer's scores), not by what the pool stores.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "kvc/kernels/backend.h"

namespace kvc::cachesvc {

// Bump allocator over chunks that one allocate/free pair hands out (device or pinned host
// memory). Pointers stay valid until Reset().
class ChunkArena {
 public:
  using AllocFn = kernels::KernelStatus (kernels::KernelBackend::*)(size_t, void**);
  using FreeFn = void (kernels::KernelBackend::*)(void*);

  ChunkArena(kernels::KernelBackend* backend, AllocFn alloc, FreeFn free)
      : backend_(backend), alloc_(alloc), free_(free) {}
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;
  ~ChunkArena();

  // `bytes` (> 0) at a 256-byte aligned address. RESOURCE_EXHAUSTED when no memory.
  absl::StatusOr<char*> Take(size_t bytes);
  // Everything taken is free again. Keeps at most `keep_bytes` of chunks for the next user.
  void Reset(size_t keep_bytes);
  size_t held_bytes() const { return held_; }

 private:
  struct Chunk {
    char* data = nullptr;
    size_t size = 0;
  };
  kernels::KernelBackend* backend_;
  AllocFn alloc_;
  FreeFn free_;
  std::vector<Chunk> chunks_;
  size_t current_ = 0;  // chunk being filled
  size_t offset_ = 0;   // bytes used in it
  size_t held_ = 0;
};

class StagingContext {
 public:
  static absl::StatusOr<std::unique_ptr<StagingContext>> Create(kernels::KernelBackend* backend);
  StagingContext(const StagingContext&) = delete;
  StagingContext& operator=(const StagingContext&) = delete;
  ~StagingContext();

  kernels::StreamHandle stream() const { return stream_; }
  ChunkArena& device() { return device_; }
  ChunkArena& pinned() { return pinned_; }

 private:
  StagingContext(kernels::KernelBackend* backend, kernels::StreamHandle stream);

  kernels::KernelBackend* backend_;
  kernels::StreamHandle stream_;
  ChunkArena device_;
  ChunkArena pinned_;
};

class StagingPool {
 public:
  explicit StagingPool(kernels::KernelBackend* backend) : backend_(backend) {}

  kernels::KernelBackend* backend() const { return backend_; }
  // An idle context, or a new one. RESOURCE_EXHAUSTED/UNAVAILABLE when none can be made.
  absl::StatusOr<std::unique_ptr<StagingContext>> Acquire();
  // Takes back a context whose stream has no pending work.
  void Release(std::unique_ptr<StagingContext> context);

 private:
  kernels::KernelBackend* const backend_;
  kvc::Mutex mu_;
  std::vector<std::unique_ptr<StagingContext>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
