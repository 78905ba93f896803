// OpStage: the kernel ops of one core step (a transaction, a Fetch chunk, a layer's scores, an
// Attend) and the host data they take.
//
// On a host pool every pointer is passed to the ops as it is and Finish() has nothing to do.
// On a device pool In() copies host data into page-locked staging memory and enqueues its copy
// into device scratch on the step's own stream; Out() hands the op device scratch and Finish()
// copies it back (device -> pinned -> the caller's memory) after synchronizing the stream.
// Scratch() is memory only ops touch (an f32 copy between two ops) on either kind of pool.
//
//   OpStage stage(pool);
//   a.src_blocks = stage.In(blocks.data(), n);
//   a.keys = stage.Out(out.data(), n * d);
//   KVC_RETURN_IF_ERROR(stage.Launch("ReadTokens", [&](kernels::StreamHandle s) {
//     return pool->backend()->ReadTokens(a, s); }));
//   KVC_RETURN_IF_ERROR(stage.Finish());  // `out` holds the result from here on
//
// A staging failure (no scratch memory) is sticky: In/Out/Scratch return null from then on,
// Launch runs nothing and returns it, so a step never launches an op on a missing argument.
// The destructor synchronizes the stream before the staging memory is reused, also on the
// early returns of a failed step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "cachesvc/core/pool/block_pool.h"
#include "cachesvc/core/pool/staging.h"
#include "kvc/kernels/backend.h"

namespace kvc::cachesvc {

// INTERNAL for a kernel op that failed on input the core validated (a bug or a device
// fault, never the caller's fault), naming the op.
absl::Status KernelFailure(const kernels::KernelStatus& status, const char* op);

class OpStage {
 public:
  explicit OpStage(BlockPool* pool);
  OpStage(const OpStage&) = delete;
  OpStage& operator=(const OpStage&) = delete;
  ~OpStage();

  kernels::KernelBackend* backend() const { return backend_; }
  kernels::StreamHandle stream() const { return stream_; }
  bool on_device() const { return context_ != nullptr; }

  template <class T>
  const T* In(const T* host, size_t count) {
    return static_cast<const T*>(InBytes(host, count * sizeof(T)));
  }
  template <class T>
  T* Out(T* host, size_t count) {
    return static_cast<T*>(OutBytes(host, count * sizeof(T), /*copy_in=*/false));
  }
  template <class T>
  T* InOut(T* host, size_t count) {
    return static_cast<T*>(OutBytes(host, count * sizeof(T), /*copy_in=*/true));
  }
  template <class T>
  T* Scratch(size_t count) {
    return static_cast<T*>(ScratchBytes(count * sizeof(T)));
  }
  // The lane table's three arrays, staged.
  kernels::LaneTable In(const kernels::LaneTable& lanes);

  // Runs `launch(stream())` unless staging failed; a failed op is the caller's INTERNAL (see
  // KernelFailure), named `what`.
  template <class F>
  absl::Status Launch(const char* what, F&& launch) {
    if (!status_.ok()) return status_;
    return Check(launch(stream_), what);
  }
  // Copies every Out/InOut back to its host memory and waits for the stream. The step's
  // first error otherwise (an op that faulted on the device shows here).
  absl::Status Finish();

 private:
  struct Output {
    void* host;
    const void* device;
    size_t bytes;
  };
  const void* InBytes(const void* host, size_t bytes);
  void* OutBytes(void* host, size_t bytes, bool copy_in);
  void* ScratchBytes(size_t bytes);
  absl::Status Check(const kernels::KernelStatus& status, const char* what);
  void Fail(absl::Status status);

  kernels::KernelBackend* backend_;
  StagingPool* staging_;
  std::unique_ptr<StagingContext> context_;
  kernels::StreamHandle stream_;
  absl::Status status_;
  std::vector<Output> outputs_;
  std::vector<std::unique_ptr<char[]>> host_scratch_;  // Scratch() on a host pool
};

}  // namespace kvc::cachesvc
