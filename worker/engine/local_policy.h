// Eviction policies for the LOCAL in-memory cache only: simple baselines that let the
// evaluation harness be validated before the service's policies (StreamingLLM, SnapKV, H2O in
// cachesvc/) are wired in. They see positions only, no attention scores.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace kvc::worker {

class LocalEvictionPolicy {
 public:
  virtual ~LocalEvictionPolicy() = default;

  // Indices (ascending) into `positions` of the tokens one (layer, kv head) keeps.
  // positions: the stored positions, strictly increasing.
  virtual std::vector<int64_t> SelectKeep(int32_t layer, int32_t kv_head,
                                          absl::Span<const int32_t> positions) const = 0;

  // When true, after eviction the cache closes the gaps: survivors get consecutive positions
  // ending at the newest one and their keys are re-rotated by (new - old) position. This is
  // StreamingLLM's "positions inside the cache": attention only sees relative offsets, so no
  // offset ever exceeds the cache span, however long the stream.
  virtual bool ClosesGaps() const { return false; }

  virtual std::string Describe() const = 0;
};

// Keeps the last `window` tokens (window-only attention; diverges once early tokens go).
std::unique_ptr<LocalEvictionPolicy> MakeLocalWindowPolicy(int64_t window);

// StreamingLLM-style: the first `sinks` stored tokens plus the last `window` tokens. Keys keep
// their original positions (no re-rotation to in-cache positions).
// With `close_gaps`, sinks are re-rotated next to the window (see ClosesGaps()).
std::unique_ptr<LocalEvictionPolicy> MakeLocalSinkWindowPolicy(int64_t sinks, int64_t window,
                                                               bool close_gaps = false);

}  // namespace kvc::worker
