// Plain driver for the kernel checks: no GoogleTest needed (GPU machines may lack it).
//   kvc_kernel_checks [--backends spec,cpu,cuda] [--filter SUBSTR] [--json FILE]
//                     [--require-cuda]
// Exit status 0 when nothing failed; skips (no GPU) are not failures unless --require-cuda;
// 77 when every selected check was skipped (reported as skipped by ctest).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "check_framework.h"

using kvc::kernels::BackendKind;
using kvc::kernels::testing::CheckContext;
using kvc::kernels::testing::Registry;
using kvc::kernels::testing::RunCheck;
using kvc::kernels::testing::RunsOn;

namespace {

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (c == '\n')
      o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backends = "spec,cpu,cuda", filter, json_path;
  bool require_cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backends" && i + 1 < argc)
      backends = argv[++i];
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--json" && i + 1 < argc)
      json_path = argv[++i];
    else if (a == "--require-cuda")
      require_cuda = true;
    else {
      std::fprintf(
          stderr,
          "usage: %s [--backends spec,cpu,cuda] [--filter S] [--json FILE] [--require-cuda]\n",
          argv[0]);
      return 2;
    }
  }
  struct Target {
    const char* label;
    bool per_backend;
    BackendKind kind;
  };
  std::vector<Target> targets;
  if (backends.find("spec") != std::string::npos)
    targets.push_back({"spec", false, BackendKind::kReference});
  if (backends.find("cpu") != std::string::npos)
    targets.push_back({"cpu", true, BackendKind::kCpu});
  if (backends.find("cuda") != std::string::npos)
    targets.push_back({"cuda", true, BackendKind::kCuda});

  int passed = 0, failed = 0, skipped = 0;
  std::string json = "{\"checks\": [\n";
  bool first = true;
  for (const Target& t : targets) {
    for (const auto& check : Registry()) {
      if (check.per_backend != t.per_backend || !RunsOn(check, t.kind)) continue;
      const std::string name = std::string(t.label) + "/" + check.name;
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      CheckContext ctx;
      const auto start = std::chrono::steady_clock::now();
      RunCheck(check, t.kind, &ctx);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      const bool skip_is_failure = require_cuda && t.kind == BackendKind::kCuda;
      const char* verdict = ctx.num_failures() > 0 ? "FAIL"
                            : ctx.skipped()        ? (skip_is_failure ? "FAIL" : "SKIP")
                                                   : "PASS";
      std::printf("%-4s %-45s %8.1f ms%s%s\n", verdict, name.c_str(), ms, ctx.skipped() ? "  " : "",
                  ctx.skipped() ? ctx.skip_reason().c_str() : "");
      for (const auto& line : ctx.logs()) std::printf("       %s\n", line.c_str());
      for (const auto& f : ctx.failures()) std::printf("       failure: %s\n", f.c_str());
      if (verdict[0] == 'F')
        ++failed;
      else if (verdict[0] == 'S')
        ++skipped;
      else
        ++passed;
      json += std::string(first ? "" : ",\n") + "  {\"name\": \"" + name + "\", \"verdict\": \"" +
              verdict + "\", \"ms\": " + std::to_string(ms) + ", \"skip_reason\": \"" +
              JsonEscape(ctx.skip_reason()) +
              "\", \"failures\": " + std::to_string(ctx.num_failures()) + ", \"metrics\": {";
      bool first_metric = true;
      for (const auto& [k, v] : ctx.metrics()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        json += std::string(first_metric ? "" : ", ") + "\"" + k + "\": " + buf;
        first_metric = false;
      }
      json += "}, \"log\": [";
      for (size_t i = 0; i < ctx.logs().size(); ++i)
        json += (i ? ", \"" : "\"") + JsonEscape(ctx.logs()[i]) + "\"";
      json += "], \"failure_messages\": [";
      for (size_t i = 0; i < ctx.failures().size(); ++i)
        json += (i ? ", \"" : "\"") + JsonEscape(ctx.failures()[i]) + "\"";
      json += "]}";
      first = false;
    }
  }
  json += "\n], \"passed\": " + std::to_string(passed) + ", \"failed\": " + std::to_string(failed) +
          ", \"skipped\": " + std::to_string(skipped) + "}\n";
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  if (!json_path.empty()) std::ofstream(json_path) << json;
  if (failed > 0) return 1;
  return passed == 0 && skipped > 0 ? 77 : 0;  // all skipped: ctest's SKIP_RETURN_CODE
}
