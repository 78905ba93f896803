#include "cachesvc/core/pool/host_block_pool.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/pool/pool_options.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

// Blocks the trimmer takes out of the free lists at a time: their pages are released in
// ~10 ms here, so an allocation that needs exactly those blocks back waits at most that.
constexpr int64_t kTrimBatchBytes = int64_t{64} << 20;
// Segments reserved beyond twice the capacity, so that a few owners' partly used segments
// cannot starve a small pool of segments.
constexpr int64_t kSlackSegments = 64;

// Releases the whole pages under each run of consecutive `blocks` (sorted here); returns the
// bytes released, or the first error.
absl::StatusOr<int64_t> ReleaseRuns(HostArena* memory, std::vector<BlockId> blocks,
                                    int64_t block_bytes) {
  std::sort(blocks.begin(), blocks.end());
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t released = 0;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    const int64_t begin = (int64_t{blocks[i]} * block_bytes + page - 1) / page * page;
    const int64_t end = (int64_t{blocks[j - 1]} + 1) * block_bytes / page * page;
    if (end > begin) {
      KVC_RETURN_IF_ERROR(
          memory->ReleasePages(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
      released += end - begin;
    }
    i = j;
  }
  return released;
}

}  // namespace

absl::Status FromKernelStatus(const kernels::KernelStatus& status, const char* op) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(op, ": ", status.detail);
  switch (status.code) {
    case kernels::KernelStatusCode::kInvalidArgument:
      return absl::InvalidArgumentError(message);
    case kernels::KernelStatusCode::kUnsupported:
      return absl::UnimplementedError(message);
    case kernels::KernelStatusCode::kUnavailable:
      return absl::UnavailableError(message);
    case kernels::KernelStatusCode::kOutOfMemory:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::unique_ptr<HostBlockPool>> HostBlockPool::Create(
    const PoolOptions& options, kernels::KernelBackend* backend) {
  KVC_RETURN_IF_ERROR(ValidatePoolOptions(options));
  if (options.device != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("pool '", options.name, "': device '",
                                                   options.device,
                                                   "' is not host memory (see DeviceBlockPool)"));
  }
  KVC_CHECK(backend != nullptr && backend->kind() != kernels::BackendKind::kCuda)
      << "a host pool needs a host kernel backend";
  return std::unique_ptr<HostBlockPool>(new HostBlockPool(options, backend));
}

HostBlockPool::HostBlockPool(const PoolOptions& options, kernels::KernelBackend* backend)
    : options_(options), backend_(backend), keep_free_bytes_(KeepFreeBytes(options)) {
  if (trims()) trimmer_ = std::thread([this] { TrimmerLoop(); });
}

HostBlockPool::~HostBlockPool() {
  if (!trimmer_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(trim_mu_);
    stop_ = true;
  }
  trim_cv_.notify_all();
  trimmer_.join();
}

void HostBlockPool::TrimmerLoop() {
  std::unique_lock<std::mutex> lock(trim_mu_);
  for (;;) {
    trim_cv_.wait(lock, [this] { return trim_wanted_ || stop_; });
    if (stop_) return;
    trim_wanted_ = false;
    lock.unlock();
    TrimFreePages();
    lock.lock();
  }
}

int32_t HostBlockPool::OwnerLocked(const std::string& owner) {
  auto [it, added] = owner_ids_.try_emplace(owner, static_cast<int32_t>(owner_ids_.size()));
  return it->second;
}

HostBlockPool::Owned& HostBlockPool::OwnedLocked(FormatArena& a, int32_t owner) {
  if (a.owners.size() <= static_cast<size_t>(owner))
    a.owners.resize(static_cast<size_t>(owner) + 1);
  return a.owners[static_cast<size_t>(owner)];
}

void HostBlockPool::ListFreeLocked(FormatArena& a, int64_t s, BlockId id, bool warm) {
  Segment& g = a.segments[static_cast<size_t>(s)];
  Owned& o = OwnedLocked(a, g.owner);
  (warm ? g.warm : g.cold).push_back(id);
  ++o.free;
  o.any.insert(s);
  if (warm) o.warm.insert(s);
}

absl::Status HostBlockPool::ClaimLocked(FormatArena& a, int64_t s, int32_t owner) {
  KVC_RETURN_IF_ERROR(a.memory.Claim(s));
  Segment& g = a.segments[static_cast<size_t>(s)];
  g = Segment{};
  g.owner = owner;
  g.epoch = ++epochs_;
  const int64_t first = s * a.per_segment;
  // Highest id first: the lists are stacks, so blocks go out in address order.
  for (int64_t j = a.per_segment - 1; j >= 0; --j) {
    ListFreeLocked(a, s, static_cast<BlockId>(first + j), /*warm=*/false);
  }
  g.allocated.assign(static_cast<size_t>(a.per_segment), false);
  SetEmptyLocked(a, s);
  ++claimed_;
  return absl::OkStatus();
}

void HostBlockPool::DisownLocked(FormatArena& a, int64_t s) {
  Segment& g = a.segments[static_cast<size_t>(s)];
  KVC_CHECK(g.owner >= 0 && g.used == 0 && g.trimming == 0) << "disowning a segment in use";
  Owned& o = OwnedLocked(a, g.owner);
  o.any.erase(s);
  o.warm.erase(s);
  o.free -= static_cast<int64_t>(g.warm.size() + g.cold.size());
  warm_bytes_ -= static_cast<int64_t>(g.warm.size()) * a.block_bytes;
  free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
  g.warm.clear();
  g.cold.clear();
  g.owner = kReleasing;
  SetEmptyLocked(a, s);
  ++a.releasing;
}

void HostBlockPool::UnclaimLocked(FormatArena& a, int64_t s) {
  a.memory.Unclaim(s);
  a.segments[static_cast<size_t>(s)] = Segment{};
  a.unclaimed.push_back(s);
  --a.releasing;
  --claimed_;
}

void HostBlockPool::SetEmptyLocked(FormatArena& a, int64_t s) {
  const Segment& g = a.segments[static_cast<size_t>(s)];
  const bool empty = g.owner >= 0 && g.used == 0 && g.trimming == 0;
  const auto it = a.empty_owner.find(s);
  if (it != a.empty_owner.end()) {
    if (empty && it->second == g.owner) return;
    --OwnedLocked(a, it->second).empty;
    a.empty.erase(s);
    a.empty_owner.erase(it);
  }
  if (empty) {
    ++OwnedLocked(a, g.owner).empty;
    a.empty.insert(s);
    a.empty_owner.emplace(s, g.owner);
  }
}

absl::Status HostBlockPool::ReserveLocked(StorageFormat format) {
  FormatArena& a = arenas_[static_cast<size_t>(format)];
  if (a.memory.data() != nullptr) return absl::OkStatus();
  a.block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  a.segment_bytes = SegmentBytes(options_, a.block_bytes);
  a.per_segment = a.segment_bytes / a.block_bytes;
  const int64_t wanted =
      (2 * options_.capacity_bytes + a.segment_bytes - 1) / a.segment_bytes + kSlackSegments;
  // Block ids are int32.
  const int64_t n = std::min<int64_t>(wanted, INT32_MAX / a.per_segment);
  KVC_ASSIGN_OR_RETURN(
      a.memory, HostArena::Reserve(
                    static_cast<size_t>(n * a.segment_bytes), static_cast<size_t>(a.segment_bytes),
                    absl::StrCat("kvc-", options_.name, "-", kernels::StorageFormatName(format))));
  a.segments.resize(static_cast<size_t>(n));
  a.unclaimed.reserve(static_cast<size_t>(n));
  for (int64_t s = n - 1; s >= 0; --s) a.unclaimed.push_back(s);
  return absl::OkStatus();
}

int64_t HostBlockPool::TrimStep(size_t f) {
  HostArena* memory = nullptr;
  int64_t s = -1;
  int64_t segment_bytes = 0;
  int64_t block_bytes = 0;
  int64_t warm_released = 0;
  std::vector<BlockId> batch;
  {
    kvc::MutexLock lock(&mu_);
    FormatArena& a = arenas_[f];
    const int64_t keep = keep_free_bytes_ / 2;
    if (warm_bytes_ <= keep || a.memory.data() == nullptr) return -1;
    memory = &a.memory;  // made once, before any block of it was free; never moves
    segment_bytes = a.segment_bytes;
    block_bytes = a.block_bytes;
    // A whole free segment with warm pages goes back at once.
    for (int64_t e : a.empty) {
      if (!a.segments[static_cast<size_t>(e)].warm.empty()) {
        s = e;
        break;
      }
    }
    if (s >= 0) {
      warm_released =
          static_cast<int64_t>(a.segments[static_cast<size_t>(s)].warm.size()) * block_bytes;
      DisownLocked(a, s);
    } else {
      // Else the oldest warm blocks of a segment that has some.
      for (const Owned& o : a.owners) {
        if (!o.warm.empty()) {
          s = *o.warm.begin();
          break;
        }
      }
      if (s < 0) return -1;
      Segment& g = a.segments[static_cast<size_t>(s)];
      Owned& o = OwnedLocked(a, g.owner);
      const int64_t n = std::min<int64_t>({(warm_bytes_ - keep + block_bytes - 1) / block_bytes,
                                           static_cast<int64_t>(g.warm.size()),
                                           std::max<int64_t>(1, kTrimBatchBytes / block_bytes)});
      // The bottom of the LIFO list: freed longest ago, the least likely to be reused warm.
      batch.assign(g.warm.begin(), g.warm.begin() + n);
      g.warm.erase(g.warm.begin(), g.warm.begin() + n);
      g.trimming += static_cast<int32_t>(n);
      o.trimming += n;
      o.free -= n;
      if (g.warm.empty()) o.warm.erase(s);
      if (g.warm.empty() && g.cold.empty()) o.any.erase(s);
      SetEmptyLocked(a, s);
      warm_bytes_ -= n * block_bytes;
      free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
    }
  }
  if (batch.empty()) {
    // The segment is nobody's now: no allocation can reach it while its pages go.
    const absl::Status released = memory->ReleasePages(static_cast<size_t>(s * segment_bytes),
                                                       static_cast<size_t>(segment_bytes));
    kvc::MutexLock lock(&mu_);
    // A failed punch loses nothing: unclaiming drops kvcached's mapping either way, and the
    // memfd's pages go with its last mapping.
    if (!released.ok()) warm_released = 0;
    UnclaimLocked(arenas_[f], s);
    released_bytes_.fetch_add(warm_released, std::memory_order_relaxed);
    return warm_released;
  }
  const absl::StatusOr<int64_t> done = ReleaseRuns(memory, batch, block_bytes);
  kvc::MutexLock lock(&mu_);
  FormatArena& a = arenas_[f];
  Segment& g = a.segments[static_cast<size_t>(s)];
  g.trimming -= static_cast<int32_t>(batch.size());
  OwnedLocked(a, g.owner).trimming -= static_cast<int64_t>(batch.size());
  // Not released after all (the OS refused): the blocks are still warm.
  for (BlockId id : batch) ListFreeLocked(a, s, id, /*warm=*/!done.ok());
  if (!done.ok()) {
    warm_bytes_ += static_cast<int64_t>(batch.size()) * block_bytes;
    free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
  }
  SetEmptyLocked(a, s);
  if (!done.ok()) return -1;  // trying again now would fail the same way
  released_bytes_.fetch_add(*done, std::memory_order_relaxed);
  return *done;
}

int64_t HostBlockPool::TrimFreePages() {
  // Whoever calls while the trimmer thread is in the middle of a batch waits for it: on
  // return, the pages past the watermark are gone, not merely off the warm lists.
  std::lock_guard<std::mutex> one_at_a_time(trim_run_mu_);
  if (!trims()) return 0;  // keep_free_bytes >= capacity: every page stays
  int64_t released = 0;
  for (size_t f = 0; f < static_cast<size_t>(kernels::kNumStorageFormats); ++f) {
    for (int64_t step; (step = TrimStep(f)) >= 0;) released += step;
  }
  return released;
}

int64_t HostBlockPool::ResidentBytes() const {
  kvc::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const FormatArena& a : arenas_) {
    const int64_t bytes = a.memory.ResidentBytes();
    if (bytes < 0) return -1;
    total += bytes;
  }
  return total;
}

int64_t HostBlockPool::segment_bytes(StorageFormat format) const {
  return SegmentBytes(options_, static_cast<int64_t>(layout(format).block_bytes));
}

int64_t HostBlockPool::claimed_segments() const {
  kvc::MutexLock lock(&mu_);
  return claimed_;
}

kernels::BlockLayout HostBlockPool::layout(StorageFormat format) const {
  return kernels::MakeBlockLayout(format, options_.geometry.head_dim,
                                  options_.geometry.block_tokens);
}

kernels::PagedArena HostBlockPool::arena(StorageFormat format) {
  kvc::MutexLock lock(&mu_);
  const FormatArena& a = arenas_[static_cast<size_t>(format)];
  kernels::PagedArena view;
  view.base = a.memory.data();
  view.layout = layout(format);
  view.num_blocks = static_cast<int32_t>(static_cast<int64_t>(a.segments.size()) * a.per_segment);
  return view;
}

int64_t HostBlockPool::used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }

int64_t HostBlockPool::used_blocks(StorageFormat format) const {
  return used_blocks_[static_cast<size_t>(format)].load(std::memory_order_relaxed);
}

int64_t HostBlockPool::free_resident_bytes() const {
  return free_resident_bytes_.load(std::memory_order_relaxed);
}

int64_t HostBlockPool::released_bytes_total() const {
  return released_bytes_.load(std::memory_order_relaxed);
}

absl::StatusOr<SharedArena> HostBlockPool::ShareArena(StorageFormat format,
                                                      const std::string& /*owner*/) {
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  kvc::MutexLock lock(&mu_);
  KVC_RETURN_IF_ERROR(ReserveLocked(format));
  const FormatArena& a = arenas_[static_cast<size_t>(format)];
  if (!a.memory.shareable()) {
    return absl::FailedPreconditionError(
        "this host has no memfd: the pool's memory cannot be mapped by another process");
  }
  SharedArena shared;
  shared.bytes = static_cast<int64_t>(a.memory.size());
  shared.segment_bytes = a.segment_bytes;
  return shared;
}

absl::StatusOr<UniqueFd> HostBlockPool::ShareSegment(StorageFormat format, const std::string& owner,
                                                     int64_t index, uint64_t epoch) {
  kvc::MutexLock lock(&mu_);
  const FormatArena& a = arenas_[static_cast<size_t>(format)];
  const auto it = owner_ids_.find(owner);
  // Another owner's segment, a reused one and one that holds nothing read alike: none of
  // them is the caller's to map.
  if (index < 0 || index >= static_cast<int64_t>(a.segments.size()) || it == owner_ids_.end() ||
      a.segments[static_cast<size_t>(index)].owner != it->second ||
      a.segments[static_cast<size_t>(index)].epoch != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment ", index, " (epoch ", epoch,
                     ") holds none of this tenant's blocks now: lease again"));
  }
  return a.memory.ShareSegment(index);
}

std::vector<SegmentRef> HostBlockPool::SegmentsOf(StorageFormat format,
                                                  absl::Span<const BlockId> blocks) const {
  kvc::MutexLock lock(&mu_);
  const FormatArena& a = arenas_[static_cast<size_t>(format)];
  std::vector<SegmentRef> refs;
  if (a.per_segment == 0) return refs;
  std::vector<int64_t> indexes;
  indexes.reserve(blocks.size());
  for (BlockId b : blocks) indexes.push_back(int64_t{b} / a.per_segment);
  std::sort(indexes.begin(), indexes.end());
  indexes.erase(std::unique(indexes.begin(), indexes.end()), indexes.end());
  for (int64_t s : indexes) {
    if (s < static_cast<int64_t>(a.segments.size())) {
      refs.push_back(SegmentRef{s, a.segments[static_cast<size_t>(s)].epoch});
    }
  }
  return refs;
}

absl::Status HostBlockPool::AllocateFor(StorageFormat format, int64_t n, const std::string& owner,
                                        std::vector<BlockId>* out) {
  KVC_CHECK(n >= 0) << n;
  KVC_RETURN_IF_ERROR(CheckFormatFits(options_, format));
  if (n == 0) return absl::OkStatus();
  const int64_t block_bytes = static_cast<int64_t>(layout(format).block_bytes);
  for (;;) {
    {
      kvc::MutexLock lock(&mu_);
      KVC_RETURN_IF_ERROR(ReserveLocked(format));
      FormatArena& a = arenas_[static_cast<size_t>(format)];
      const int64_t free_bytes =
          options_.capacity_bytes - used_bytes_.load(std::memory_order_relaxed);
      if (n * block_bytes > free_bytes) {
        return PoolFullError(options_, format, n, block_bytes, free_bytes);
      }
      const int32_t me = OwnerLocked(owner);
      Owned& mine = OwnedLocked(a, me);
      // Segments this owner could claim: unclaimed ones, and other owners' free ones.
      const int64_t claimable =
          static_cast<int64_t>(a.unclaimed.size() + a.empty.size()) - mine.empty;
      if (n <= mine.free + claimable * a.per_segment) {
        // Segments first, so that taking the blocks below cannot fail: all or none.
        while (mine.free < n) KVC_RETURN_IF_ERROR(ClaimAnyLocked(a, me));
        int64_t warm_taken = 0;
        for (int64_t taken = 0; taken < n; ++taken) {
          const int64_t s = !mine.warm.empty() ? *mine.warm.begin() : *mine.any.begin();
          Segment& g = a.segments[static_cast<size_t>(s)];
          BlockId id;
          if (!g.warm.empty()) {
            id = g.warm.back();
            g.warm.pop_back();
            ++warm_taken;
          } else {
            id = g.cold.back();
            g.cold.pop_back();
          }
          g.allocated[static_cast<size_t>(id - s * a.per_segment)] = true;
          ++g.used;
          --mine.free;
          if (g.warm.empty()) mine.warm.erase(s);
          if (g.warm.empty() && g.cold.empty()) mine.any.erase(s);
          SetEmptyLocked(a, s);
          out->push_back(id);
        }
        warm_bytes_ -= warm_taken * block_bytes;
        free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
        used_blocks_[static_cast<size_t>(format)].fetch_add(n, std::memory_order_relaxed);
        used_bytes_.fetch_add(n * block_bytes, std::memory_order_relaxed);
        return absl::OkStatus();
      }
      if (n > mine.free + mine.trimming + (claimable + a.releasing) * a.per_segment) {
        return absl::ResourceExhaustedError(
            absl::StrCat("pool '", options_.name, "' has ", free_bytes,
                         " bytes free, but not in segments ", "this tenant may use: every ",
                         a.segment_bytes, "-byte segment of ", kernels::StorageFormatName(format),
                         " blocks holds other tenants' blocks; release or compress sequences"));
      }
    }
    // Only blocks or segments the trimmer holds would do: they are back within one batch.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

absl::Status HostBlockPool::ClaimAnyLocked(FormatArena& a, int32_t owner) {
  int64_t s = -1;
  if (!a.unclaimed.empty()) {
    s = a.unclaimed.back();
    a.unclaimed.pop_back();
  } else {
    // Another owner's free segment goes back first, its pages punched out (its old memfd
    // reads as zeros to that owner's readers); the claim below backs it with a new one.
    for (int64_t e : a.empty) {
      if (a.segments[static_cast<size_t>(e)].owner != owner) {
        s = e;
        break;
      }
    }
    KVC_CHECK(s >= 0) << "counted a claimable segment that is not there";
    DisownLocked(a, s);
    (void)a.memory.ReleasePages(static_cast<size_t>(s * a.segment_bytes),
                                static_cast<size_t>(a.segment_bytes));
    UnclaimLocked(a, s);
    a.unclaimed.pop_back();
  }
  absl::Status claimed = ClaimLocked(a, s, owner);
  if (!claimed.ok()) a.unclaimed.push_back(s);
  return claimed;
}

void HostBlockPool::Free(StorageFormat format, absl::Span<const BlockId> blocks) {
  if (blocks.empty()) return;
  bool trim = false;
  {
    kvc::MutexLock lock(&mu_);
    FormatArena& a = arenas_[static_cast<size_t>(format)];
    for (BlockId id : blocks) {
      const int64_t s = a.per_segment == 0 ? -1 : int64_t{id} / a.per_segment;
      KVC_CHECK(id >= 0 && s >= 0 && s < static_cast<int64_t>(a.segments.size()) &&
                a.segments[static_cast<size_t>(s)].owner >= 0)
          << "block " << id << " was never handed out by pool " << options_.name;
      Segment& g = a.segments[static_cast<size_t>(s)];
      const auto j = static_cast<size_t>(id - s * a.per_segment);
      KVC_CHECK(g.allocated[j]) << "double free of block " << id;
      g.allocated[j] = false;
      --g.used;
      ListFreeLocked(a, s, id, /*warm=*/true);
      SetEmptyLocked(a, s);
    }
    const int64_t n = static_cast<int64_t>(blocks.size());
    used_blocks_[static_cast<size_t>(format)].fetch_sub(n, std::memory_order_relaxed);
    used_bytes_.fetch_sub(n * a.block_bytes, std::memory_order_relaxed);
    warm_bytes_ += n * a.block_bytes;
    free_resident_bytes_.store(warm_bytes_, std::memory_order_relaxed);
    trim = trims() && warm_bytes_ > keep_free_bytes_;
  }
  if (trim) {
    {
      std::lock_guard<std::mutex> lock(trim_mu_);
      trim_wanted_ = true;
    }
    trim_cv_.notify_one();
  }
}

}  // namespace kvc::cachesvc
