// Dump: every record a reader gets for a sequence, as stored (byte for byte, with its
// position), per lane: two sequences that Dump equal serve the same bytes. For the sharing
// tests (prefix cache, fork): a sharer's Dump must not change when another holder mutates.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/store/kv_store.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvc::cachesvc {

struct Dump {
  std::vector<std::string> chunks;
  bool operator==(const Dump& o) const { return chunks == o.chunks; }
  bool operator!=(const Dump& o) const { return !(*this == o); }
};

// Records of the tokens at positions < `limit` (all by default), per lane in stored order.
inline Dump Read(KvStore& store, const std::string& id, int32_t limit = 1 << 30) {
  std::map<std::pair<int, int>, std::string> lanes;
  FetchParams f;
  f.sequence_id = id;
  f.format = FetchFormat::kStored;
  EXPECT_THAT(store.Fetch(f,
                          [&](FetchChunk& c) {
                            std::string& s = lanes[{c.layer, c.kv_head}];
                            const size_t rb = static_cast<size_t>(c.record_bytes);
                            for (int i = 0; i < c.num_tokens; ++i) {
                              if (c.positions[static_cast<size_t>(i)] >= limit) continue;
                              absl::StrAppend(&s, c.positions[static_cast<size_t>(i)], ":",
                                              c.keys.substr(i * rb, rb),
                                              c.values.substr(i * rb, rb));
                            }
                            return true;
                          }),
              ::kvc::testing::IsOk());
  Dump d;
  for (auto& [lane, records] : lanes) d.chunks.push_back(std::move(records));
  return d;
}

}  // namespace kvc::cachesvc
