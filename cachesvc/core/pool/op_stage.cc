#include "cachesvc/core/pool/op_stage.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

absl::Status KernelFailure(const kernels::KernelStatus& status, const char* op) {
  return absl::InternalError(absl::StrCat(op, " failed on validated input (",
                                          kernels::KernelStatusCodeName(status.code), ": ",
                                          status.detail, "); the sequence is unchanged"));
}

OpStage::OpStage(BlockPool* pool) : backend_(pool->backend()), staging_(pool->staging()) {
  if (staging_ == nullptr) return;
  absl::StatusOr<std::unique_ptr<StagingContext>> context = staging_->Acquire();
  if (!context.ok()) {
    Fail(context.status());
    return;
  }
  context_ = *std::move(context);
  stream_ = context_->stream();
}

OpStage::~OpStage() {
  if (context_ == nullptr) return;
  // Ops of a step that returned early may still run; the next user must not see them.
  static_cast<void>(backend_->Synchronize(stream_));
  staging_->Release(std::move(context_));
}

void OpStage::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

const void* OpStage::InBytes(const void* host, size_t bytes) {
  if (context_ == nullptr || host == nullptr) return host;
  if (!status_.ok() || bytes == 0) return nullptr;
  absl::StatusOr<char*> pinned = context_->pinned().Take(bytes);
  absl::StatusOr<char*> device =
      pinned.ok() ? context_->device().Take(bytes) : absl::StatusOr<char*>(pinned.status());
  if (!device.ok()) {
    Fail(device.status());
    return nullptr;
  }
  // The host bytes are copied now; the pinned copy is read by the device later.
  std::memcpy(*pinned, host, bytes);
  const kernels::KernelStatus ks = backend_->CopyToDevice(*device, *pinned, bytes, stream_);
  if (!ks.ok()) {
    Fail(KernelFailure(ks, "staging copy to the device"));
    return nullptr;
  }
  return *device;
}

void* OpStage::OutBytes(void* host, size_t bytes, bool copy_in) {
  if (context_ == nullptr || host == nullptr) return host;
  void* device = copy_in ? const_cast<void*>(InBytes(host, bytes)) : ScratchBytes(bytes);
  if (device != nullptr) outputs_.push_back(Output{host, device, bytes});
  return device;
}

void* OpStage::ScratchBytes(size_t bytes) {
  if (!status_.ok() || bytes == 0) return nullptr;
  if (context_ == nullptr) {
    host_scratch_.push_back(std::unique_ptr<char[]>(new (std::nothrow) char[bytes]));
    if (host_scratch_.back() == nullptr) {
      Fail(absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes")));
    }
    return host_scratch_.back().get();
  }
  absl::StatusOr<char*> device = context_->device().Take(bytes);
  if (!device.ok()) {
    Fail(device.status());
    return nullptr;
  }
  return *device;
}

kernels::LaneTable OpStage::In(const kernels::LaneTable& lanes) {
  kernels::LaneTable out = lanes;
  const size_t n = static_cast<size_t>(lanes.num_lanes);
  out.block_offsets = In(lanes.block_offsets, n + 1);
  out.block_ids = In(lanes.block_ids, static_cast<size_t>(lanes.block_offsets[n]));
  out.num_tokens = In(lanes.num_tokens, n);
  return out;
}

absl::Status OpStage::Check(const kernels::KernelStatus& status, const char* what) {
  if (!status.ok()) Fail(KernelFailure(status, what));
  return status_;
}

absl::Status OpStage::Finish() {
  if (context_ == nullptr || !status_.ok()) {
    outputs_.clear();
    return status_;
  }
  std::vector<char*> staged;
  staged.reserve(outputs_.size());
  for (const Output& o : outputs_) {
    absl::StatusOr<char*> pinned = context_->pinned().Take(o.bytes);
    if (!pinned.ok()) {
      Fail(pinned.status());
      break;
    }
    const kernels::KernelStatus ks = backend_->CopyToHost(*pinned, o.device, o.bytes, stream_);
    if (!ks.ok()) {
      Fail(KernelFailure(ks, "staging copy to the host"));
      break;
    }
    staged.push_back(*pinned);
  }
  const kernels::KernelStatus ks = backend_->Synchronize(stream_);
  if (!ks.ok()) Fail(KernelFailure(ks, "the step's device work"));
  if (status_.ok()) {
    for (size_t i = 0; i < outputs_.size(); ++i) {
      std::memcpy(outputs_[i].host, staged[i], outputs_[i].bytes);
    }
  }
  outputs_.clear();
  return status_;
}

}  // namespace kvc::cachesvc
