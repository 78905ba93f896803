// One CPU backend (one ThreadPool) called from several threads at once, as the service does
// for different sequences: every concurrent result equals the serial one bit for bit (the
// CPU ops' work split does not depend on which thread runs a chunk). Also run under TSan.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kvc/kernels/backend.h"

namespace kvc::kernels {
namespace {

class CpuConcurrencyTest : public ::testing::Test {
 protected:
  static constexpr int kLanes = 4, kTokens = 700, kD = 64, kG = 2, kWindow = 8;

  void SetUp() override {
    ASSERT_TRUE(CreateBackend(BackendKind::kCpu, BackendOptions{3}, &backend_).ok());
    layout_ = MakeBlockLayout(StorageFormat::kInt4G32, kD, 16);
    const int per_lane = (kTokens + 15) / 16;
    num_blocks_ = kLanes * per_lane;
    arena_.assign(static_cast<size_t>(num_blocks_) * layout_.block_bytes, 0);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> kv(static_cast<size_t>(kLanes) * kTokens * kD);
    for (float& x : kv) x = normal(rng);
    std::vector<int32_t> blocks, slots;
    for (int l = 0; l < kLanes; ++l) {
      offsets_.push_back(l * per_lane);
      for (int b = 0; b < per_lane; ++b) ids_.push_back(l * per_lane + b);
      for (int t = 0; t < kTokens; ++t) {
        blocks.push_back(l * per_lane + t / 16);
        slots.push_back(t % 16);
        positions_.push_back(t);
      }
    }
    offsets_.push_back(kLanes * per_lane);
    tokens_.assign(kLanes, kTokens);
    WriteTokensArgs w;
    w.arena = Arena();
    w.num_rows = static_cast<int32_t>(blocks.size());
    w.dtype = DType::kF32;
    w.keys = kv.data();
    w.values = kv.data();
    w.dst_blocks = blocks.data();
    w.dst_slots = slots.data();
    ASSERT_TRUE(backend_->WriteTokens(w, StreamHandle{}).ok());
    queries_.resize(static_cast<size_t>(kLanes) * kG * kWindow * kD);
    for (float& x : queries_) x = normal(rng);
    for (int l = 0; l < kLanes; ++l) {
      for (int w2 = 0; w2 < kWindow; ++w2) qpos_.push_back(kTokens - kWindow + w2);
    }
  }

  PagedArena Arena() { return PagedArena{arena_.data(), layout_, num_blocks_}; }
  LaneTable Lanes() {
    return LaneTable{kLanes, offsets_.data(), ids_.data(), tokens_.data(), kTokens};
  }

  // Decode output and H2O scores of one step.
  std::vector<float> Decode() {
    std::vector<float> out(static_cast<size_t>(kLanes) * kG * kD);
    std::vector<float> scores(static_cast<size_t>(kLanes) * kTokens, 0.0f);
    DecodeAttentionArgs a;
    a.arena = Arena();
    a.lanes = Lanes();
    a.group_size = kG;
    a.dtype = DType::kF32;
    a.queries = queries_.data();
    a.out = out.data();
    a.scores = scores.data();
    EXPECT_TRUE(backend_->DecodeAttention(a, StreamHandle{}).ok());
    out.insert(out.end(), scores.begin(), scores.end());
    return out;
  }
  std::vector<float> SnapKv() {
    std::vector<float> scores(static_cast<size_t>(kLanes) * kTokens, 0.0f);
    SnapKvScoreArgs a;
    a.arena = Arena();
    a.lanes = Lanes();
    a.group_size = kG;
    a.window = kWindow;
    a.query_dtype = DType::kF32;
    a.queries = queries_.data();
    a.query_positions = qpos_.data();
    a.key_positions = positions_.data();
    a.scores = scores.data();
    EXPECT_TRUE(backend_->SnapKvScore(a, StreamHandle{}).ok());
    return scores;
  }
  std::vector<uint8_t> Select(const std::vector<float>& scores) {
    std::vector<uint8_t> keep(static_cast<size_t>(kLanes) * kTokens);
    SelectArgs a;
    a.num_lanes = kLanes;
    a.num_tokens = tokens_.data();
    a.max_tokens = kTokens;
    a.positions = positions_.data();
    a.scores = scores.data();
    a.sinks = 4;
    a.recent = kWindow;
    a.budget = 100;
    a.keep = keep.data();
    EXPECT_TRUE(backend_->Select(a, StreamHandle{}).ok());
    return keep;
  }

  std::unique_ptr<KernelBackend> backend_;
  BlockLayout layout_;
  int32_t num_blocks_ = 0;
  std::vector<uint8_t> arena_;
  std::vector<int32_t> offsets_, ids_, tokens_, positions_, qpos_;
  std::vector<float> queries_;
};

TEST_F(CpuConcurrencyTest, ConcurrentOpsEqualSerialResults) {
  const std::vector<float> decode = Decode();
  const std::vector<float> snap = SnapKv();
  const std::vector<uint8_t> keep = Select(snap);
  constexpr int kThreads = 4, kRounds = 6;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < kRounds; ++r) {
        switch ((i + r) % 3) {
          case 0:
            mismatches[i] += Decode() != decode;
            break;
          case 1:
            mismatches[i] += SnapKv() != snap;
            break;
          default:
            mismatches[i] += Select(snap) != keep;
            break;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(mismatches[i], 0) << "thread " << i;
}

}  // namespace
}  // namespace kvc::kernels
