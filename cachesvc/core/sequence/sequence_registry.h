// SequenceRegistry: (scope, id) -> Sequence, sharded by hash so concurrent RPCs on different
// sequences rarely share a lock. A shard lock is held only for the map operation itself;
// the count is an atomic, so sizing the registry locks nothing. The scope is the
// authenticated tenant (or "" without authentication): each tenant has its own id space, so
// one tenant can neither reach nor detect another's sequences (not even by a taken id).
//
// Beside the map, the entries in creation order (SequenceOrder), for listings that cost
// O(page).
//
// Entries are shared_ptr because an RPC may still hold a sequence while Release removes it
// from the map; the last holder frees the metadata (its blocks were already returned by
// Release). Ownership is one level deep: nothing else is shared.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/sequence/sequence.h"
#include "cachesvc/core/sequence/sequence_order.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class SequenceRegistry {
 public:
  // ALREADY_EXISTS if the id is taken in the sequence's scope; RESOURCE_EXHAUSTED when
  // `max_size` sequences exist.
  absl::Status Insert(const std::shared_ptr<Sequence>& sequence, int64_t max_size);
  // NOT_FOUND (naming a prefix of the id, never the scope) if absent.
  absl::StatusOr<std::shared_ptr<Sequence>> Find(const TenantScope& scope,
                                                 const std::string& id) const;
  // Removes the entry if present; returns whether it was.
  bool Erase(const TenantScope& scope, const std::string& id);
  int64_t size() const { return size_.load(std::memory_order_relaxed); }
  // A snapshot of every entry.
  std::vector<std::shared_ptr<Sequence>> All() const;
  // Listings in creation order, O(page) (sequence_order.h).
  SequenceOrder::Page List(const SequenceOrder::Query& query) const { return order_.List(query); }
  int64_t Count(const SequenceOrder::Query& query) const { return order_.Count(query); }

 private:
  static constexpr size_t kShards = 32;
  using Key = std::pair<TenantScope, std::string>;  // (scope, id)
  struct Shard {
    mutable kvc::Mutex mu;
    absl::flat_hash_map<Key, std::shared_ptr<Sequence>> map ABSL_GUARDED_BY(mu);
  };
  Shard& shard(const Key& key) const;

  mutable std::array<Shard, kShards> shards_;
  std::atomic<int64_t> size_{0};
  // Changed under the entry's shard lock (shard, then order): an entry is in both or neither.
  SequenceOrder order_;
};

}  // namespace kvc::cachesvc
