// A tiny check registry shared by two drivers: GoogleTest (CI, via gtest_main_checks.cc)
// and a plain executable (kvc_kernel_checks, for GPU machines without GoogleTest). A check
// is a function of a CheckContext; backend checks run once per backend under test and
// compare against the reference backend.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kvc/kernels/backend.h"

namespace kvc::kernels::testing {

class CheckContext {
 public:
  // Records a failure (the check keeps running so that one run reports every mismatch).
  void Fail(const std::string& msg) {
    if (failures_.size() < 50) failures_.push_back(msg);
    ++num_failures_;
  }
  bool Expect(bool cond, const std::string& msg) {
    if (!cond) Fail(msg);
    return cond;
  }
  bool ExpectOk(KernelStatus s, const std::string& what) {
    if (s.ok()) return true;
    Fail(what + ": " + KernelStatusCodeName(s.code) + " " + s.detail);
    return false;
  }
  void Skip(const std::string& reason) { skipped_ = true, skip_reason_ = reason; }
  // A named figure for the report (round-trip errors, ...).
  void Metric(const std::string& name, double value) { metrics_[name] = value; }
  void Log(const std::string& line) { logs_.push_back(line); }

  bool skipped() const { return skipped_; }
  const std::string& skip_reason() const { return skip_reason_; }
  int num_failures() const { return num_failures_; }
  const std::vector<std::string>& failures() const { return failures_; }
  const std::map<std::string, double>& metrics() const { return metrics_; }
  const std::vector<std::string>& logs() const { return logs_; }

  KernelBackend* backend = nullptr;    // under test (backend checks only)
  KernelBackend* reference = nullptr;  // the oracle (backend checks only)

 private:
  bool skipped_ = false;
  std::string skip_reason_;
  int num_failures_ = 0;
  std::vector<std::string> failures_;
  std::map<std::string, double> metrics_;
  std::vector<std::string> logs_;
};

struct CheckInfo {
  std::string name;
  bool per_backend;  // run for each backend under test (cpu, cuda) against the reference
  std::function<void(CheckContext&)> fn;
  // A per-backend check of the CPU backend only (its own code paths); other backends do not
  // list it, rather than report a pass for a check that tested nothing.
  bool cpu_only = false;
};

// Whether `check` is run (and reported) for backend `kind`.
inline bool RunsOn(const CheckInfo& check, BackendKind kind) {
  return !check.cpu_only || kind == BackendKind::kCpu;
}

std::vector<CheckInfo>& Registry();

struct Registrar {
  Registrar(const char* name, bool per_backend, std::function<void(CheckContext&)> fn,
            bool cpu_only = false) {
    Registry().push_back({name, per_backend, std::move(fn), cpu_only});
  }
};

#define KVC_SPEC_CHECK(Name)                                                      \
  static void Name(::kvc::kernels::testing::CheckContext& ctx);                   \
  static ::kvc::kernels::testing::Registrar Name##_registrar(#Name, false, Name); \
  static void Name(::kvc::kernels::testing::CheckContext& ctx)
#define KVC_BACKEND_CHECK(Name)                                                  \
  static void Name(::kvc::kernels::testing::CheckContext& ctx);                  \
  static ::kvc::kernels::testing::Registrar Name##_registrar(#Name, true, Name); \
  static void Name(::kvc::kernels::testing::CheckContext& ctx)
#define KVC_CPU_BACKEND_CHECK(Name)                                                    \
  static void Name(::kvc::kernels::testing::CheckContext& ctx);                        \
  static ::kvc::kernels::testing::Registrar Name##_registrar(#Name, true, Name, true); \
  static void Name(::kvc::kernels::testing::CheckContext& ctx)

// Runs one check. For per-backend checks creates both backends; a backend that cannot be
// created (CUDA without a device) makes the check skip with the reason.
void RunCheck(const CheckInfo& check, BackendKind kind, CheckContext* ctx);

template <typename... Args>
std::string Str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace kvc::kernels::testing
