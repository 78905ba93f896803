// GGUF reader: well-formed synthetic files parse; malformed ones fail with clear statuses.
#include "worker/engine/gguf_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "worker/engine/dequantize.h"

namespace kvc::worker {
namespace {

// Builds GGUF v3 bytes: metadata, then tensor infos, then 32-byte-aligned data.
class GgufBuilder {
 public:
  void KvString(const std::string& key, const std::string& v) {
    Str(kv_, key);
    U32(kv_, 8);
    Str(kv_, v);
    ++kv_count_;
  }
  void KvU32(const std::string& key, uint32_t v) {
    Str(kv_, key);
    U32(kv_, 4);
    U32(kv_, v);
    ++kv_count_;
  }
  void KvF32(const std::string& key, float v) {
    Str(kv_, key);
    U32(kv_, 6);
    Raw(kv_, &v, 4);
    ++kv_count_;
  }
  void KvStrings(const std::string& key, const std::vector<std::string>& v) {
    Str(kv_, key);
    U32(kv_, 9);
    U32(kv_, 8);
    U64(kv_, v.size());
    for (const auto& s : v) Str(kv_, s);
    ++kv_count_;
  }
  void Tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
              const std::vector<uint8_t>& bytes) {
    Str(ti_, name);
    U32(ti_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(ti_, d);
    U32(ti_, type);
    while (data_.size() % 32) data_.push_back(0);
    U64(ti_, data_.size());
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    ++tensor_count_;
  }
  std::vector<uint8_t> Build() const {
    std::vector<uint8_t> out;
    Raw(out, "GGUF", 4);
    U32(out, 3);
    U64(out, tensor_count_);
    U64(out, kv_count_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    out.insert(out.end(), ti_.begin(), ti_.end());
    while (out.size() % 32) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  static void Raw(std::vector<uint8_t>& b, const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  static void U32(std::vector<uint8_t>& b, uint32_t v) { Raw(b, &v, 4); }
  static void U64(std::vector<uint8_t>& b, uint64_t v) { Raw(b, &v, 8); }
  static void Str(std::vector<uint8_t>& b, const std::string& s) {
    U64(b, s.size());
    Raw(b, s.data(), s.size());
  }
  std::vector<uint8_t> kv_, ti_, data_;
  uint64_t kv_count_ = 0, tensor_count_ = 0;
};

std::string WriteTemp(const std::vector<uint8_t>& bytes, const std::string& tag) {
  std::string path = ::testing::TempDir() + "gguf_test_" + tag + ".gguf";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return path;
}

GgufBuilder SmallModel() {
  GgufBuilder b;
  b.KvString("general.architecture", "llama");
  b.KvU32("llama.block_count", 2);
  b.KvF32("llama.rope.freq_base", 100000.0f);
  b.KvStrings("tokenizer.ggml.tokens", {"a", "b", "ab"});
  std::vector<uint8_t> f32(8 * 4);
  for (int i = 0; i < 8; ++i) {
    const float v = static_cast<float>(i) * 0.5f;
    std::memcpy(f32.data() + 4 * i, &v, 4);
  }
  b.Tensor("w.f32", {4, 2}, 0, f32);
  std::vector<uint8_t> q8(34);
  const uint16_t d = FloatToHalf(0.25f);
  std::memcpy(q8.data(), &d, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  b.Tensor("w.q8", {32}, 8, q8);
  return b;
}

TEST(GgufFileTest, ParsesMetadataAndTensors) {
  auto file = GgufFile::Open(WriteTemp(SmallModel().Build(), "ok"));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("llama.rope.freq_base")), 100000.0f);
  EXPECT_EQ((*f.GetArray("tokenizer.ggml.tokens"))->strings,
            (std::vector<std::string>{"a", "b", "ab"}));
  EXPECT_EQ(f.GetInt("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.GetInt("general.architecture").status().code(), absl::StatusCode::kInvalidArgument);

  const GgufTensor* t = f.FindTensor("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{4, 2}));
  std::vector<float> out(8);
  ASSERT_TRUE(Dequantize(t->type, t->data, 8, out.data()).ok());
  EXPECT_FLOAT_EQ(out[7], 3.5f);
  const GgufTensor* q = f.FindTensor("w.q8");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ8_0);
  EXPECT_EQ(q->num_bytes, 34u);
  std::vector<float> qv(32);
  ASSERT_TRUE(Dequantize(q->type, q->data, 32, qv.data()).ok());
  EXPECT_FLOAT_EQ(qv[0], -4.0f);
  EXPECT_FLOAT_EQ(qv[31], 3.75f);
}

TEST(GgufFileTest, MissingFileIsNotFound) {
  auto file = GgufFile::Open("/nonexistent/model.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST(GgufFileTest, BadMagicIsInvalidArgument) {
  std::vector<uint8_t> bytes = SmallModel().Build();
  bytes[0] = 'X';
  auto file = GgufFile::Open(WriteTemp(bytes, "magic"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("magic"), std::string::npos);
}

TEST(GgufFileTest, TruncatedFileIsInvalidArgument) {
  std::vector<uint8_t> bytes = SmallModel().Build();
  for (size_t keep : {size_t{30}, bytes.size() / 2, bytes.size() - 3}) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(keep));
    auto file = GgufFile::Open(WriteTemp(cut, "cut"));
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << "kept " << keep;
  }
}

TEST(GgufFileTest, UnknownTensorTypeIsInvalidArgument) {
  GgufBuilder b;
  b.Tensor("w", {32}, 14 /* Q6_K: not supported */, std::vector<uint8_t>(210));
  auto file = GgufFile::Open(WriteTemp(b.Build(), "type"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvc::worker
