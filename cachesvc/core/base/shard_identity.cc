#include "cachesvc/core/base/shard_identity.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cachesvc/core/base/quote.h"

namespace kvc::cachesvc {
namespace {

std::string NewIncarnation() {
  std::random_device random;
  uint32_t value = 0;
  while (value == 0) value = random();
  return absl::StrFormat("%08x", value);
}

}  // namespace

ShardIdentity::ShardIdentity()
    : incarnation_(NewIncarnation()),
      started_unix_ms_(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()) {}

absl::StatusOr<ShardIdentity> ShardIdentity::Create(std::string name, double weight) {
  if (!name.empty() && !IsValidShardName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard name ", Quoted(name),
                     " is invalid: use 1-63 characters from [a-z0-9-] that start and end with a "
                     "letter or digit (a DNS label, such as the StatefulSet pod name)"));
  }
  if (weight == 0) weight = 1.0;
  if (!(weight > 0 && weight <= 1000)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard weight is ", weight, "; expected a number in (0, 1000]"));
  }
  ShardIdentity identity;
  identity.name_ = std::move(name);
  identity.weight_ = weight;
  return identity;
}

std::string ShardIdentity::Qualify(absl::string_view local) const {
  if (!clustered()) return std::string(local);
  return absl::StrCat(name_, ":", incarnation_, ":", local);
}

absl::StatusOr<std::string> ShardIdentity::Resolve(const std::string& id) const {
  if (!clustered()) return id;
  ClusterIdParts parts;
  if (!ParseClusterId(id, &parts)) return Qualify(id);
  if (parts.shard != name_) {
    return absl::NotFoundError(absl::StrCat("sequence ", Quoted(id), " belongs to shard ",
                                            Quoted(std::string(parts.shard)), "; this is shard ",
                                            Quoted(name_), ": send it to the shard it names"));
  }
  if (parts.incarnation != incarnation_) {
    return absl::NotFoundError(
        absl::StrCat("sequence ", Quoted(id), " was created before shard ", Quoted(name_),
                     " restarted (incarnation ", parts.incarnation, ", now ", incarnation_,
                     "); its KV was lost with that process: create the sequence again"));
  }
  return id;
}

absl::Status ShardIdentity::CheckClientId(const std::string& id) const {
  if (clustered() && ParseClusterId(id, /*parts=*/nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_sequence_id ", Quoted(id),
                     " has the form of a cluster id (<shard>:<8 hex>:<id>); on a cluster shard "
                     "choose one without it (the shard adds its own prefix)"));
  }
  return absl::OkStatus();
}

}  // namespace kvc::cachesvc
