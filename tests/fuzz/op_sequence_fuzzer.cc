// op_sequence_fuzzer: the fuzzer's bytes choose the operations of the model-based test
// (tests/cachesvc/kv_store_model.h: create / append / fetch / get / compress / attend /
// release, with and without a raw residual) on a fresh KvStore, and every result is checked
// against the model. Each choice Uniform(lo, hi) takes one byte (two when the range is wider
// than 256); the run stops when the bytes do. A divergence prints the model's message and
// aborts, and so does a pool that is not empty after releasing everything.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/cachesvc/kv_store_model.h"

namespace {

class ByteSource {
 public:
  ByteSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  // Past the end every choice is `lo`; the caller stops at the next step.
  int Uniform(int lo, int hi) {
    const unsigned range = static_cast<unsigned>(hi - lo) + 1;
    unsigned v = Next();
    if (range > 256) v = v << 8 | Next();
    return lo + static_cast<int>(v % range);
  }

 private:
  unsigned Next() { return pos_ < size_ ? data_[pos_++] : 0; }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void Finding(const absl::Status& s, int step) {
  std::fprintf(stderr, "op_sequence_fuzzer FINDING at step %d: %s\n", step, s.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSource source(data, size);
  auto runner = kvc::cachesvc::model::ModelRunner::Create(
      [&source](int lo, int hi) { return source.Uniform(lo, hi); });
  if (!runner.ok()) Finding(runner.status(), -1);
  int step = 0;
  for (; !source.empty(); ++step) {
    if (absl::Status s = (*runner)->Step(); !s.ok()) Finding(s, step);
  }
  if (absl::Status s = (*runner)->ReleaseAll(); !s.ok()) Finding(s, step);
  return 0;
}
