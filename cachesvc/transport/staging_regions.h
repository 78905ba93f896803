// StagingRegions: the shared buffers same-node writers append through. A writer asks the
// local socket for a region ("STAGE <bytes>", local_socket.h); the server makes a memfd of that
// size, seals its size, maps it read-only here and hands the fd over; the writer maps it
// writable, puts dense keys and values into it and sends an Append whose `staged` field names
// the region and offsets instead of carrying the bytes. The pool then copies (or quantizes)
// straight from the region: one copy, none through protobuf or the TCP stack.
//
// Safety: the size seals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) mean the writer cannot
// truncate the file under the server's mapping (a read past the end would be SIGBUS); bytes it
// changes during an Append only change its own appended KV. A region lives until the socket
// connection that opened it closes; an Append in flight keeps it mapped until it returns.
// A region belongs to the tenant whose connection opened it: only that tenant's Appends can
// name it, and each tenant's open regions count against a budget.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cachesvc/core/base/tenant_scope.h"

namespace kvc::cachesvc {

class StagingRegion {
 public:
  // RESOURCE_EXHAUSTED when the memfd or the mapping cannot be made.
  static absl::StatusOr<std::shared_ptr<StagingRegion>> Create(int64_t bytes);
  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;
  ~StagingRegion();

  const uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  int fd() const { return fd_; }  // owned; handed to the writer (SCM_RIGHTS dups it)

 private:
  StagingRegion(const uint8_t* data, int64_t bytes, int fd) : data_(data), bytes_(bytes), fd_(fd) {}
  const uint8_t* const data_;
  const int64_t bytes_;
  const int fd_;
};

class StagingRegions {
 public:
  static constexpr int64_t kMinBytes = int64_t{4} << 10;
  static constexpr int64_t kMaxBytes = int64_t{1} << 30;

  // `budget_per_scope`: bytes of regions one scope (tenant) may hold open at once, across
  // its connections; `budget_total`: all scopes together.
  StagingRegions(int64_t budget_per_scope, int64_t budget_total)
      : budget_per_scope_(budget_per_scope), budget_total_(budget_total) {}

  // A new region of `bytes` (kMinBytes .. kMaxBytes, else INVALID_ARGUMENT) for `scope`, and
  // its id: 32 hex digits from a CSPRNG, so an id names one region of one run and cannot be
  // guessed. RESOURCE_EXHAUSTED naming the budget when the scope's regions or everyone's
  // would pass it.
  absl::StatusOr<std::pair<std::string, std::shared_ptr<StagingRegion>>> Open(
      int64_t bytes, const TenantScope& scope);
  // Forgets `id`; an Append still reading it keeps the mapping until it returns.
  void Close(const std::string& id);
  // `scope`'s region `id`. FAILED_PRECONDITION naming a prefix of `id` when it has no such
  // region open (another scope's region reads the same: an id works only for its tenant).
  absl::StatusOr<std::shared_ptr<const StagingRegion>> Find(const TenantScope& scope,
                                                            const std::string& id) const;
  int64_t open_bytes() const;

 private:
  struct OpenRegion {
    std::shared_ptr<StagingRegion> region;
    TenantScope scope;
  };
  const int64_t budget_per_scope_;
  const int64_t budget_total_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, OpenRegion> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TenantScope, int64_t> scope_bytes_ ABSL_GUARDED_BY(mu_);
  int64_t open_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::cachesvc
