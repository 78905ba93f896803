#include "client/tools/loadgen/dense_check.h"

#include <set>
#include <utility>

#include "absl/strings/str_format.h"

namespace kvc::loadgen {

absl::Status CheckDense(const client::FetchResult& got, const AppendedKv& appended) {
  const std::vector<std::string>& keys = *appended.keys;
  const std::vector<std::string>& values = *appended.values;
  const size_t row = appended.head_bytes;
  const size_t token_bytes = static_cast<size_t>(appended.num_heads) * row;
  std::set<std::pair<int, int>> seen;
  for (const client::FetchedHead& h : got.heads) {
    if (h.layer < 0 || static_cast<size_t>(h.layer) >= keys.size() || h.kv_head < 0 ||
        h.kv_head >= appended.num_heads) {
      return absl::DataLossError(
          absl::StrFormat("layer %d head %d was never appended", h.layer, h.kv_head));
    }
    if (!seen.emplace(h.layer, h.kv_head).second) {
      return absl::DataLossError(
          absl::StrFormat("layer %d head %d came twice", h.layer, h.kv_head));
    }
    const auto n = static_cast<size_t>(appended.tokens);
    if (h.first_index != 0 || h.positions.size() != n || h.keys.size() != n * row ||
        h.values.size() != n * row) {
      return absl::DataLossError(absl::StrFormat(
          "layer %d head %d holds %zu tokens from index %d (%zu key and %zu value bytes); "
          "%d were appended",
          h.layer, h.kv_head, h.positions.size(), h.first_index, h.keys.size(), h.values.size(),
          appended.tokens));
    }
    const std::string& k = keys[static_cast<size_t>(h.layer)];
    const std::string& v = values[static_cast<size_t>(h.layer)];
    for (size_t t = 0; t < n; ++t) {
      if (h.positions[t] != static_cast<int32_t>(t)) {
        return absl::DataLossError(absl::StrFormat("layer %d head %d token %zu has position %d",
                                                   h.layer, h.kv_head, t, h.positions[t]));
      }
      const size_t in = t * token_bytes + static_cast<size_t>(h.kv_head) * row;
      for (const auto& [name, input, output] :
           {std::make_tuple("keys", &k, &h.keys), std::make_tuple("values", &v, &h.values)}) {
        if (input->compare(in, row, *output, t * row, row) != 0) {
          return absl::DataLossError(absl::StrFormat("layer %d head %d token %zu: the %s differ",
                                                     h.layer, h.kv_head, t, name));
        }
      }
    }
  }
  const size_t lanes = keys.size() * static_cast<size_t>(appended.num_heads);
  if (seen.size() != lanes) {
    return absl::DataLossError(
        absl::StrFormat("%zu of %zu (layer, head) lanes came back", seen.size(), lanes));
  }
  return absl::OkStatus();
}

}  // namespace kvc::loadgen
