// Quoting client-supplied strings in error messages: at most a short prefix, so a 1 MB id
// cannot make a status larger than gRPC's metadata limit (the caller would then see
// RESOURCE_EXHAUSTED instead of the code the contract promises).
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvc::cachesvc {

inline std::string Quoted(absl::string_view s) {
  constexpr size_t kShown = 64;
  if (s.size() <= kShown) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kShown), "...' (", s.size(), " bytes)");
}

}  // namespace kvc::cachesvc
