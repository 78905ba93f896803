#include "common/cluster_id.h"

namespace kvc {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

bool IsValidShardName(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  if (!IsLowerAlnum(name.front()) || !IsLowerAlnum(name.back())) return false;
  for (char c : name) {
    if (!IsLowerAlnum(c) && c != '-') return false;
  }
  return true;
}

bool ParseClusterId(absl::string_view id, ClusterIdParts* parts) {
  const size_t first = id.find(':');
  if (first == absl::string_view::npos || !IsValidShardName(id.substr(0, first))) return false;
  const absl::string_view rest = id.substr(first + 1);
  if (rest.size() < 10 || rest[8] != ':') return false;
  for (size_t i = 0; i < 8; ++i) {
    if (!IsLowerHex(rest[i])) return false;
  }
  if (parts != nullptr) *parts = {id.substr(0, first), rest.substr(0, 8), rest.substr(9)};
  return true;
}

}  // namespace kvc
