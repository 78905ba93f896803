// SaltedId: "<prefix><16 hex digits>" from a per-process salt and a counter, through a 64-bit
// mixer (splitmix64): unique per process, unguessable enough to avoid accidental collisions
// between clients, and cheap. Sequence ids ("s-") and lease ids ("l-") use it.
#pragma once

#include <cstdint>
#include <string>

namespace kvc::cachesvc {

inline std::string SaltedId(const char* prefix, uint64_t salt, uint64_t counter) {
  uint64_t x = salt + 0x9e3779b97f4a7c15ull * counter;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 15; i >= 0; --i) id.push_back(kHex[(x >> (4 * i)) & 0xf]);
  return id;
}

}  // namespace kvc::cachesvc
