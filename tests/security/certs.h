// Test certificates made at test time by make_certs.sh (openssl CLI), once per test binary,
// in a fresh temporary directory. The file names are make_certs.sh's.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvc::testing {

// The directory holding the certificates; aborts the binary if they cannot be made.
inline const std::string& CertDir() {
  static const std::string* const kDir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kvc-certs-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "cannot make a temporary directory for the test certificates\n");
      std::abort();
    }
    const std::string command = absl::StrCat(KVC_MAKE_CERTS_SCRIPT, " ", pattern, " >/dev/null");
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "%s failed (is openssl on PATH?)\n", command.c_str());
      std::abort();
    }
    static std::string made = pattern;
    std::atexit([] { (void)std::system(("rm -rf " + made).c_str()); });
    return &made;
  }();
  return *kDir;
}

inline std::string CertFile(const std::string& name) { return CertDir() + "/" + name; }

}  // namespace kvc::testing
