// LocalSocket: the same-node data path's doorway. A unix socket beside the gRPC listener
// through which a reader on this node receives the memfds of the host pools' arenas
// (SCM_RIGHTS) and maps them read-only; with a lease (KvCacheService.LeaseSequence) it then
// reads a sequence's records straight from the pool's pages instead of through gRPC.
//
// Trust: a mapping shows the whole arena, every tenant's KV in that pool, so only peers whose
// uid (SO_PEERCRED, checked by the kernel) is allowed may connect: the server's own uid, or
// exactly the configured list. The fds cannot be used to write the pool (host_arena.h: a
// read-only reopen other uids cannot make writable, or a memfd sealed against writable maps).
//
// Protocol (text lines of at most 512 bytes; one connection per reader, requests in order):
//   server -> "KVC-LOCAL 1 <token>\n" on connect (token: GetServerInfo.local_token, so a
//             client can tell this server from another one at the same path), or
//             "ERR <why>\n" and close (uid not allowed).
//   reader -> "ARENA <pool> <kvcache.v1.StorageFormat number>\n"
//   server -> "OK <bytes>\n" with the arena's fd attached (a host pool), or
//             "OK <bytes> CUDA <device ordinal> <128 hex digits>\n" (a device pool: the CUDA
//             IPC handle of its one allocation, where every format's arena starts; no fd), or
//             "ERR <why>\n". A CUDA IPC handle opens the allocation read-WRITE for anyone who
//             holds it and can use the device (CUDA has no read-only IPC): the uid check
//             above is what keeps it from others, and a reader must not write through it.
//   writer -> "STAGE <bytes>\n" (a staging region for Appends, staging_regions.h; at most
//             kMaxRegionsPerConnection per connection, each closed with the connection)
//   server -> "OK <region id> <bytes>\n" with the region's memfd attached (the writer maps it
//             writable), or "ERR <why>\n".
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "cachesvc/core/kv_store.h"
#include "cachesvc/rpc/staging_regions.h"

namespace kvc::cachesvc {

struct LocalSocketOptions {
  std::string path;         // filesystem path of the socket; a stale file there is replaced
  std::vector<uid_t> uids;  // peers allowed; empty = this process's effective uid only
  std::string token;        // sent in the greeting
  // Called from the socket's thread for each "connected" (greeted), "refused" (uid or too
  // many readers), "arena" (an arena fd handed out) and "staging" (a staging region opened):
  // the server counts them in metrics.
  std::function<void(const char* event)> on_event;
};

class LocalSocket {
 public:
  static constexpr size_t kMaxRegionsPerConnection = 4;

  // Binds and starts serving. UNAVAILABLE when the path cannot be bound. `regions` (outliving
  // the socket) holds the staging regions it opens.
  static absl::StatusOr<std::unique_ptr<LocalSocket>> Start(const LocalSocketOptions& options,
                                                            KvStore* store,
                                                            StagingRegions* regions);
  LocalSocket(const LocalSocket&) = delete;
  LocalSocket& operator=(const LocalSocket&) = delete;
  // Stops serving, closes every connection and removes the socket file.
  ~LocalSocket();

  const std::string& path() const { return options_.path; }

 private:
  struct Conn {
    int fd = -1;
    std::string buffer;
    std::vector<std::string> regions;  // staging regions it opened: closed with it
  };
  LocalSocket(const LocalSocketOptions& options, KvStore* store, StagingRegions* regions)
      : options_(options), store_(store), regions_(regions) {}
  void Close(Conn& conn);
  // "OK <id> <bytes>" with the fd attached, or "ERR ..."; false: the connection failed.
  bool Stage(Conn& conn, const std::string& bytes);
  void Serve();
  void Accept(std::vector<Conn>* conns);
  // Handles the complete lines in the connection's buffer; false: close it.
  bool Handle(Conn& conn);
  bool Allowed(int fd, uid_t* uid) const;
  void Event(const char* event) const {
    if (options_.on_event) options_.on_event(event);
  }

  const LocalSocketOptions options_;
  KvStore* const store_;
  StagingRegions* const regions_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the poll loop
  std::thread thread_;
};

}  // namespace kvc::cachesvc
