#include "client/tools/loadgen/kv_check.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/tools/loadgen/kv_pattern.h"

namespace kvc::loadgen {
namespace {

using client::FetchedHead;
using Kept = FetchExpectation::Kept;

void Problem(FetchCheck* check, std::string what) {
  if (check->first_problem.empty()) check->first_problem = std::move(what);
}

int64_t ExpectedRows(const FetchExpectation& e) {
  switch (e.kept) {
    case Kept::kAll:
      return e.visible_tokens;
    case Kept::kExact:
      return static_cast<int64_t>(e.positions.size());
    case Kept::kSubset:
      return e.count;
  }
  return 0;
}

// The set of positions of one lane against the expectation.
void CheckPositions(const FetchedHead& lane, const FetchExpectation& e, FetchCheck* check) {
  const std::string where = absl::StrCat("layer ", lane.layer, " head ", lane.kv_head);
  std::vector<int32_t> sorted = lane.positions;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return Problem(check, absl::StrCat(where, ": a position arrived twice"));
  }
  if (!sorted.empty() && (sorted.front() < 0 || sorted.back() >= e.visible_tokens)) {
    return Problem(check, absl::StrCat(where, ": position outside [0, ", e.visible_tokens, ")"));
  }
  const int64_t want = ExpectedRows(e);
  const auto have = static_cast<int64_t>(sorted.size());
  if (have < want) check->missing_rows += want - have;
  if (have != want) {
    return Problem(check, absl::StrCat(where, ": ", have, " tokens; expected ", want));
  }
  if (e.kept == Kept::kAll) {
    // Sorted, distinct, inside [0, visible) and `visible` of them: exactly [0, visible).
    return;
  }
  if (e.kept == Kept::kExact && sorted != e.positions) {
    return Problem(check, absl::StrCat(where, ": not the positions the eviction keeps"));
  }
  if (e.kept == Kept::kSubset &&
      !std::includes(sorted.begin(), sorted.end(), e.positions.begin(), e.positions.end())) {
    return Problem(check, absl::StrCat(where, ": a position that must be kept is missing"));
  }
}

void CheckBytes(const FetchedHead& lane, const FetchExpectation& e, FetchCheck* check) {
  const size_t row = static_cast<size_t>(e.head_dim) * 2;
  const size_t rows = lane.positions.size();
  if (lane.keys.size() != rows * row || lane.values.size() != rows * row) {
    return Problem(check, absl::StrCat("layer ", lane.layer, " head ", lane.kv_head, ": ",
                                       lane.keys.size(), "/", lane.values.size(),
                                       " key/value bytes for ", rows, " tokens of ", row));
  }
  std::string want(row, '\0');
  for (size_t i = 0; i < rows; ++i) {
    for (const bool is_value : {false, true}) {
      const std::string& got = is_value ? lane.values : lane.keys;
      PatternRow(e.sequence_key, lane.layer, lane.kv_head, lane.positions[i], e.head_dim, is_value,
                 want.data());
      if (std::memcmp(got.data() + i * row, want.data(), row) == 0) continue;
      int64_t differ = 0;
      for (size_t b = 0; b < row; ++b) differ += got[i * row + b] != want[b] ? 1 : 0;
      check->wrong_bytes += differ;
      Problem(check, absl::StrCat("layer ", lane.layer, " head ", lane.kv_head, " position ",
                                  lane.positions[i], ": ", differ, " ", is_value ? "value" : "key",
                                  " bytes differ"));
    }
    ++check->tokens_checked;
  }
}

}  // namespace

FetchCheck CheckFetch(const client::FetchResult& result, const FetchExpectation& e) {
  FetchCheck check;
  if (result.visible_tokens != e.visible_tokens) {
    Problem(&check, absl::StrCat("visible_tokens ", result.visible_tokens, "; expected ",
                                 e.visible_tokens));
  }
  if (e.stored_format) {
    if (result.storage != client::StorageFormat::kF16 || result.record_bytes != 2 * e.head_dim) {
      Problem(&check,
              absl::StrCat("stored as ", client::StorageFormatName(result.storage), " of ",
                           result.record_bytes, "-byte records; expected f16 of ", 2 * e.head_dim));
    }
  } else if (result.dtype != client::DType::kF16) {
    Problem(&check, absl::StrCat("dtype ", client::DTypeName(result.dtype), "; expected f16"));
  }
  // One lane per (layer, head), layer-major, as Fetch serves them.
  size_t next = 0;
  for (int layer = 0; layer < e.num_layers; ++layer) {
    for (int head = 0; head < e.num_heads; ++head) {
      if (next >= result.heads.size() || result.heads[next].layer != layer ||
          result.heads[next].kv_head != head) {
        check.missing_rows += ExpectedRows(e);
        Problem(&check, absl::StrCat("layer ", layer, " head ", head, " is missing"));
        continue;
      }
      const FetchedHead& lane = result.heads[next++];
      CheckPositions(lane, e, &check);
      CheckBytes(lane, e, &check);
    }
  }
  if (next != result.heads.size()) {
    Problem(&check, absl::StrCat(result.heads.size() - next, " lanes more than expected"));
  }
  return check;
}

}  // namespace kvc::loadgen
