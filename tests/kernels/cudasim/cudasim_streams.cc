// cudasim's streams: FIFO queues of device work, run only when something synchronizes.
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <utility>

#include "cudasim_internal.h"

namespace kvc_sim::internal {

namespace {

bool Blocking(const CUstream_st* s) { return (s->flags & cudaStreamNonBlocking) == 0; }

}  // namespace

std::mutex& DeviceMutex() {
  static std::mutex mu;
  return mu;
}

Queues& Q() {
  static Queues q;
  return q;
}

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

}  // namespace kvc_sim::internal
