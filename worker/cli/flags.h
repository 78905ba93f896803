// Minimal command-line flags for kvc-worker: "--name=value", "--name value" or a bare "--name"
// (boolean), plus positional arguments. Unknown flags are reported, not ignored.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvc::worker {

class Flags {
 public:
  // `known`: accepted names; `booleans`: those that take no value.
  static absl::StatusOr<Flags> Parse(int argc, char** argv, int first,
                                     const std::set<std::string>& known,
                                     const std::set<std::string>& booleans);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace kvc::worker
