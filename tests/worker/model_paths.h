// Where worker tests find the model and fixtures, and a once-per-process model load shared by
// the model-dependent tests (loading dequantizes ~135M weights, about a second).
#pragma once

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "worker/engine/llama_model.h"

namespace kvc::worker::testing {

inline std::string ModelPath() {
  if (const char* env = std::getenv("KVC_WORKER_MODEL")) return env;
  return std::string(KVC_REPO_ROOT) + "/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool ModelPresent() { return std::ifstream(ModelPath()).good(); }

inline std::string FixturePath(const std::string& name) {
  return std::string(KVC_WORKER_FIXTURES) + "/" + name;
}

// The shared model, or nullptr when the file is absent (callers GTEST_SKIP).
inline LlamaModel* SharedModel() {
  static std::unique_ptr<LlamaModel> model = [] {
    std::unique_ptr<LlamaModel> m;
    if (!ModelPresent()) return m;
    auto loaded = LlamaModel::Load(ModelPath(), /*num_threads=*/0);
    if (loaded.ok()) m = std::move(*loaded);
    return m;
  }();
  return model.get();
}

#define KVC_SKIP_WITHOUT_MODEL()                                               \
  if (!::kvc::worker::testing::ModelPresent())                                 \
  GTEST_SKIP() << "model not found at " << ::kvc::worker::testing::ModelPath() \
               << "; run scripts/fetch_model.sh (or set KVC_WORKER_MODEL) to run this test"

}  // namespace kvc::worker::testing
