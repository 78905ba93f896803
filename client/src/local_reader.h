// LocalReader: the client's half of the same-node data path (cachesvc/transport/local_socket.h).
// It connects to the server's unix socket, checks that the greeting carries the token the
// server gave over gRPC (the same server, not another one at that path), authenticates with
// the client's bearer token, and reserves address space for each host arena it reads; then,
// per lease, it maps the segments the lease names (read-only, at their place in the arena)
// wherever it has not mapped them at the lease's epoch yet (Map), for the leased read path
// (read_path.h) to decode. The server never writes a leased record, so reads need no lock; a lease
// that could have ended while it was read is ABORTED, never returned. The same connection opens
// staging regions for Appends (OpenStaging, staging_space.h). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "client/src/lease_decode.h"
#include "client/src/staging_space.h"
#include "common/mutex.h"
#include "kvc/client/types.h"

namespace kvc::client::internal {

class LocalReader {
 public:
  // FAILED_PRECONDITION when the socket refuses this uid or `bearer_token` (empty: none),
  // or greets with another token than `token`; UNAVAILABLE when nothing listens at `path`.
  static absl::StatusOr<std::unique_ptr<LocalReader>> Connect(const std::string& path,
                                                              const std::string& token,
                                                              const std::string& bearer_token);
  LocalReader(const LocalReader&) = delete;
  LocalReader& operator=(const LocalReader&) = delete;
  ~LocalReader();  // unmaps every arena

  const std::string& path() const { return path_; }
  // The token of the server this reader is connected to (its greeting's).
  const std::string& token() const { return token_; }
  // False once the server's end of the socket closed (it exited or restarted: the mappings
  // are of a dead server's memory) or a lease of another server came by: the client then
  // decides its same-node path again. Never blocks.
  bool Alive();

  // The arenas of the lease's pool with every segment it names mapped (read-only) at its
  // epoch, for lease_decode.h; valid while this reader lives. UNIMPLEMENTED (read it over
  // gRPC; the reader turns stale) when the lease is of another server or cannot be mapped.
  absl::StatusOr<ArenaLookup> Map(const Lease& lease);
  // A staging region of `bytes` made by the server and mapped writable here: it stays open
  // on the server while this reader's connection does. FAILED_PRECONDITION with the server's
  // reason when it refuses (size, too many regions, an older server).
  absl::StatusOr<std::unique_ptr<StagingSpace>> OpenStaging(int64_t bytes);
  // A device pool's CUDA IPC handle ("ARENA" answered with "CUDA ..."). FAILED_PRECONDITION
  // for a host pool or a refusal (the server's reason).
  absl::StatusOr<DeviceArenaHandle> DeviceArena(const std::string& pool, StorageFormat format);

 private:
  LocalReader(int fd, std::string path, std::string token)
      : fd_(fd), path_(std::move(path)), token_(std::move(token)) {}
  // UNIMPLEMENTED (read it over gRPC) when `lease` is not from this reader's server; marks
  // the reader stale so that the client connects again.
  absl::Status CheckSameServer(const Lease& lease);
  // Maps what the lease names (Arena, per format) and returns the views to read it through.
  absl::StatusOr<ArenaLookup> MapLease(const Lease& lease);
  // The arena of (pool, format) with every segment `leased` names mapped at its epoch
  // (address space reserved on first use).
  absl::StatusOr<ArenaView> Arena(const std::string& pool, StorageFormat format,
                                  const LeaseArena* leased);
  // Sends one request line and reads the reply (and the fd sent with it, or -1). A broken
  // connection is closed for good: UNAVAILABLE.
  absl::StatusOr<std::string> Ask(const std::string& request, int* passed_fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  kvc::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  const std::string path_;
  const std::string token_;
  std::atomic<bool> stale_{false};
  struct Mapped {
    uint8_t* base = nullptr;  // reserved, inaccessible but where segments are mapped
    int64_t bytes = 0;
    int64_t segment_bytes = 0;
    std::vector<uint64_t> epochs;  // per segment: the epoch mapped, 0 = none
  };
  std::map<std::pair<std::string, int>, Mapped> maps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::client::internal
