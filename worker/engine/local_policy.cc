#include "worker/engine/local_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvc::worker {
namespace {

class SinkWindowPolicy : public LocalEvictionPolicy {
 public:
  SinkWindowPolicy(int64_t sinks, int64_t window, bool close_gaps)
      : sinks_(sinks), window_(window), close_gaps_(close_gaps) {}

  bool ClosesGaps() const override { return close_gaps_; }

  std::vector<int64_t> SelectKeep(int32_t /*layer*/, int32_t /*kv_head*/,
                                  absl::Span<const int32_t> positions) const override {
    const int64_t n = static_cast<int64_t>(positions.size());
    std::vector<int64_t> keep;
    const int64_t sink_end = std::min(sinks_, n);
    const int64_t window_begin = std::max(sink_end, n - window_);
    for (int64_t i = 0; i < sink_end; ++i) keep.push_back(i);
    for (int64_t i = window_begin; i < n; ++i) keep.push_back(i);
    return keep;
  }

  std::string Describe() const override {
    if (sinks_ == 0) return absl::StrCat("local window=", window_);
    return absl::StrCat("local sinks=", sinks_, " window=", window_,
                        close_gaps_ ? " rerotate" : "");
  }

 private:
  int64_t sinks_;
  int64_t window_;
  bool close_gaps_;
};

}  // namespace

std::unique_ptr<LocalEvictionPolicy> MakeLocalWindowPolicy(int64_t window) {
  return std::make_unique<SinkWindowPolicy>(0, window, /*close_gaps=*/false);
}

std::unique_ptr<LocalEvictionPolicy> MakeLocalSinkWindowPolicy(int64_t sinks, int64_t window,
                                                               bool close_gaps) {
  return std::make_unique<SinkWindowPolicy>(sinks, window, close_gaps);
}

}  // namespace kvc::worker
