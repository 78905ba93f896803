// GoogleTest driver for the kernel checks: registers every check of this binary's subset as
// a test (KVC_CHECK_SUBSET "cpu": spec checks + CPU backend; "cuda": CUDA backend), so
// ctest runs them with labels and a GPU-less machine reports CUDA tests as skipped.
#include <gtest/gtest.h>

#include <string>

#include "check_framework.h"

namespace {

using kvc::kernels::BackendKind;
using kvc::kernels::testing::CheckContext;
using kvc::kernels::testing::CheckInfo;
using kvc::kernels::testing::RunsOn;

class CheckTest : public ::testing::Test {
 public:
  CheckTest(const CheckInfo* check, BackendKind kind) : check_(check), kind_(kind) {}
  void TestBody() override {
    CheckContext ctx;
    kvc::kernels::testing::RunCheck(*check_, kind_, &ctx);
    for (const auto& line : ctx.logs()) std::printf("  %s\n", line.c_str());
    for (const auto& f : ctx.failures()) ADD_FAILURE() << f;
    if (ctx.num_failures() > static_cast<int>(ctx.failures().size())) {
      ADD_FAILURE() << ctx.num_failures() << " failures in total";
    }
    if (ctx.skipped() && ctx.num_failures() == 0) GTEST_SKIP() << ctx.skip_reason();
  }

 private:
  const CheckInfo* check_;
  BackendKind kind_;
};

void Register(const char* suite, const CheckInfo* check, BackendKind kind) {
  ::testing::RegisterTest(suite, check->name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [=]() -> ::testing::Test* { return new CheckTest(check, kind); });
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string subset = KVC_CHECK_SUBSET;
  for (const CheckInfo& check : kvc::kernels::testing::Registry()) {
    if (subset == "cpu") {
      if (check.per_backend)
        Register("Cpu", &check, BackendKind::kCpu);
      else
        Register("Spec", &check, BackendKind::kReference);
    } else if (check.per_backend && RunsOn(check, BackendKind::kCuda)) {
      Register("Cuda", &check, BackendKind::kCuda);
    }
  }
  return RUN_ALL_TESTS();
}
