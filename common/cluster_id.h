// The sequence ids of a cluster of kvcached shards: "<shard>:<incarnation>:<local id>". The
// shard that mints an id puts its name and incarnation (8 hex digits drawn at each start) in
// front, so a cluster client routes every call on a sequence to the shard that holds it, and a
// restarted shard tells an id of its previous life (whose KV died with it) from one it never
// saw. One grammar for the server (cachesvc/core/base/shard_identity.h) and the cluster client.
#pragma once

#include "absl/strings/string_view.h"

namespace kvc {

struct ClusterIdParts {
  absl::string_view shard;
  absl::string_view incarnation;
  absl::string_view local;
};

// 1-63 characters of [a-z0-9-], starting and ending with a letter or digit: a DNS label, so a
// StatefulSet pod name qualifies.
bool IsValidShardName(absl::string_view name);
// Whether `id` has the cluster form: a shard name, ':', 8 lowercase hex digits, ':', and a
// non-empty local id. Fills `parts` (views into `id`) when it does and `parts` is not null.
bool ParseClusterId(absl::string_view id, ClusterIdParts* parts);

}  // namespace kvc
