// SequenceOrder: the live sequences in creation order, kept so that a listing page costs
// O(page + log n), not O(pool). Each sequence is in one ordered map per group it belongs to:
// all, its scope, its tenant label, its pool, and its (scope, pool) and (tenant, pool) pairs.
// A listing walks the map of the narrowest group its filters name, from its cursor, so with
// any one filter, or a pool with a scope or tenant, every entry it visits matches; the size of
// that map is the matching total. (Scope and tenant together are walked by tenant and checked
// by scope: with authentication a tenant label is its scope, without it every scope is "".)
//
// One mutex, held for an insert or erase (O(log n) per group) and for collecting a page; the
// page's snapshots are taken afterwards under each sequence's own lock (KvStore).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "common/mutex.h"

namespace kvc::cachesvc {

class Sequence;

class SequenceOrder {
 public:
  // A place in the order: (created_unix_ms, scope, the sequence's ordinal in its scope). Unique
  // and never reused, so a cursor stays valid while sequences come and go; within a scope it
  // is creation order exactly (ids are random and cannot break ties of one millisecond). The
  // ordinal counts one scope's sequences only: a tenant's page token tells it nothing about
  // other tenants. The scope is its tenant() name.
  using Key = std::tuple<int64_t, std::string, uint64_t>;

  struct Query {
    const TenantScope* scope = nullptr;   // null: every scope
    const std::string* tenant = nullptr;  // null: every tenant label
    int pool = -1;                        // -1: every pool
    const Key* after = nullptr;           // null: from the first
    int64_t limit = 0;                    // > 0
  };
  struct Page {
    std::vector<std::shared_ptr<Sequence>> sequences;
    int64_t total = 0;  // matching sequences, before and after this page too
    bool more = false;  // matching sequences follow the last one returned
    Key last;           // the last one's place (the next page's cursor)
  };

  void Add(const std::shared_ptr<Sequence>& sequence);
  void Remove(const Sequence& sequence);
  Page List(const Query& query) const;
  // Matching sequences (as Page::total), without collecting any.
  int64_t Count(const Query& query) const;

  // A Key as a page token (opaque to callers) and back; INVALID_ARGUMENT for a token this
  // encoding never made.
  static std::string Token(const Key& key);
  static absl::StatusOr<Key> ParseToken(const std::string& token);

 private:
  using Ordered = std::map<Key, std::shared_ptr<Sequence>>;
  // The groups' names: "a"; "s", "t", "p" + one field; "sp", "tp" + two fields.
  static std::vector<std::string> GroupsOf(const Sequence& sequence);
  // The map to walk for `query` and whether every entry in it matches (else each is checked).
  const Ordered* Narrowest(const Query& query, bool* exact) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable kvc::Mutex mu_;
  absl::flat_hash_map<std::string, Ordered> groups_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const Sequence*, Key> keys_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TenantScope, uint64_t> next_ordinal_ ABSL_GUARDED_BY(mu_);  // per scope
};

}  // namespace kvc::cachesvc
