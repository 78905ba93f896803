#include "cachesvc/core/pool/staging.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {
namespace {

constexpr size_t kPinnedAlign = 256;
// A fresh chunk holds at least this much, so small steps share one chunk.
constexpr size_t kMinChunkBytes = size_t{1} << 20;
// What an idle context keeps of each kind of memory for the next step, and how many idle
// contexts a pool keeps: a burst of concurrent requests leaves at most 16 x 2 x 32 MiB of
// device and page-locked host memory behind (more contexts are made and freed as needed).
constexpr size_t kKeepBytes = size_t{32} << 20;
constexpr size_t kMaxIdle = 16;

size_t AlignPinned(size_t n) { return (n + kPinnedAlign - 1) / kPinnedAlign * kPinnedAlign; }

}  // namespace

ChunkArena::~ChunkArena() { Reset(0); }

absl::StatusOr<char*> ChunkArena::Take(size_t bytes) {
  bytes = AlignPinned(bytes);
  while (current_ < chunks_.size()) {
    Chunk& c = chunks_[current_];
    if (c.size - offset_ >= bytes) {
      char* p = c.data + offset_;
      offset_ += bytes;
      return p;
    }
    ++current_;
    offset_ = 0;
  }
  const size_t size = std::max(bytes, kMinChunkBytes);
  void* p = nullptr;
  const kernels::KernelStatus ks = (backend_->*alloc_)(size, &p);
  if (!ks.ok() || p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes of staging memory on the ",
                                                     backend_->name(), " backend: ", ks.detail));
  }
  chunks_.push_back(Chunk{static_cast<char*>(p), size});
  held_ += size;
  current_ = chunks_.size() - 1;
  offset_ = bytes;
  return static_cast<char*>(p);
}

void ChunkArena::Reset(size_t keep_bytes) {
  // Largest chunks first: one big chunk serves the next large step without a new allocation.
  std::sort(chunks_.begin(), chunks_.end(),
            [](const Chunk& a, const Chunk& b) { return a.size > b.size; });
  size_t kept = 0, n = 0;
  for (; n < chunks_.size() && kept + chunks_[n].size <= keep_bytes; ++n) kept += chunks_[n].size;
  for (size_t i = n; i < chunks_.size(); ++i) (backend_->*free_)(chunks_[i].data);
  chunks_.resize(n);
  held_ = kept;
  current_ = 0;
  offset_ = 0;
}

absl::StatusOr<std::unique_ptr<StagingContext>> StagingContext::Create(
    kernels::KernelBackend* backend) {
  kernels::StreamHandle stream;
  const kernels::KernelStatus ks = backend->CreateStream(&stream);
  if (!ks.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a ", backend->name(), " stream: ", ks.detail));
  }
  return std::unique_ptr<StagingContext>(new StagingContext(backend, stream));
}

StagingContext::StagingContext(kernels::KernelBackend* backend, kernels::StreamHandle stream)
    : backend_(backend),
      stream_(stream),
      device_(backend, &kernels::KernelBackend::Allocate, &kernels::KernelBackend::Free),
      pinned_(backend, &kernels::KernelBackend::AllocateHost, &kernels::KernelBackend::FreeHost) {}

StagingContext::~StagingContext() {
  // Nothing may still read or write the chunks when they are freed.
  static_cast<void>(backend_->Synchronize(stream_));
  device_.Reset(0);
  pinned_.Reset(0);
  backend_->DestroyStream(stream_);
}

absl::StatusOr<std::unique_ptr<StagingContext>> StagingPool::Acquire() {
  {
    kvc::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<StagingContext> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  return StagingContext::Create(backend_);
}

void StagingPool::Release(std::unique_ptr<StagingContext> context) {
  context->device().Reset(kKeepBytes);
  context->pinned().Reset(kKeepBytes);
  {
    kvc::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(std::move(context));
      return;
    }
  }
  // Destroyed outside the lock: it synchronizes and frees device memory.
  context.reset();
}

}  // namespace kvc::cachesvc
