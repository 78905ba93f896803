// ShardIdentity: which kvcached of a cluster this is (a name, and an incarnation drawn at every
// start) and the sequence ids that carry both, so that a cluster client can route every call
// on a sequence to the one shard that holds it, and a restarted shard can tell an id minted by
// its previous life (whose KV died with it) from one it never saw.
//
// A server without a shard name keeps local ids ("s-<32 hex>" or the caller's own), exactly as
// a single kvcached always did. A shard named N qualifies every id it hands out as
// "N:<incarnation>:<local id>" and accepts both that form and the bare local id.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster_id.h"

namespace kvc::cachesvc {

class ShardIdentity {
 public:
  // A server that is not a cluster shard (ids stay local); still has an incarnation.
  ShardIdentity();
  // INVALID_ARGUMENT for a bad name or a weight outside (0, 1000]; 0 means 1.
  static absl::StatusOr<ShardIdentity> Create(std::string name, double weight);

  const std::string& name() const { return name_; }
  bool clustered() const { return !name_.empty(); }
  // 8 lowercase hex digits, random per process (never 00000000).
  const std::string& incarnation() const { return incarnation_; }
  double weight() const { return weight_; }
  int64_t started_unix_ms() const { return started_unix_ms_; }

  // The id handed out for a sequence whose local id is `local`.
  std::string Qualify(absl::string_view local) const;
  // The registry key for an id a caller sent: a qualified id of this shard and incarnation, or
  // a bare local id (qualified here). NOT_FOUND, saying why, for an id of an earlier
  // incarnation of this shard (the sequence died with the restart) or of another shard.
  absl::StatusOr<std::string> Resolve(const std::string& id) const;
  // INVALID_ARGUMENT when a caller-chosen id could be read as a cluster id on this shard.
  absl::Status CheckClientId(const std::string& id) const;

 private:
  std::string name_;
  std::string incarnation_;
  double weight_ = 1.0;
  int64_t started_unix_ms_ = 0;
};

}  // namespace kvc::cachesvc
