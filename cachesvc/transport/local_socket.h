// LocalSocket: the same-node data path's doorway. A unix socket beside the gRPC listener
// through which a reader on this node, once it proved its tenant, receives the memfds of the
// host pool segments that hold that tenant's KV (SCM_RIGHTS) and maps them read-only; with a
// lease (KvCacheService.LeaseSequence) it then reads a sequence's records straight from the
// pool's pages instead of through gRPC.
//
// Trust, in layers:
//  - the kernel's peer uid (SO_PEERCRED): only the configured uids may connect, and kvcached's
//    own uid only where the config allows it (a process of that uid can read kvcached's
//    memory through /proc or ptrace whatever this socket says, so admitting it is a
//    statement that every such process is trusted);
//  - the same bearer token as gRPC, checked the same way (Authenticator), on the connection
//    before anything else; it fixes the connection's scope (tenant). Without authentication
//    configured every peer acts in the one scope "", as on gRPC. The token is checked again
//    on every request and once a second: a revoked token closes the connection (and its
//    staging regions);
//  - what is handed out: a host pool's segments belong to one tenant at a time
//    (host_block_pool.h), and SEGMENT gives a peer only segments its tenant owns now, as
//    read-only descriptors other uids cannot make writable (host_arena.h). A device pool's
//    CUDA IPC handle (which opens the whole allocation read-write) only to the tenant the
//    pool is dedicated to (PoolOptions::tenant).
// Mappings a peer already made stay readable after its token is revoked: they show that
// tenant's segments as they were mapped, until each segment is released or changes owner
// (then zeros: its pages are returned first). No new segment, lease mapping or staging
// region reaches it.
//
// Protocol (text lines of at most 512 bytes; one connection per reader, requests in order):
//   server -> "KVC-LOCAL 2 <token>\n" on connect (token: GetServerInfo.local_token, so a
//             client can tell this server from another one at the same path), or
//             "ERR <why>\n" and close (uid not allowed, too many connections).
//   reader -> "AUTH <bearer token>\n" first, within kAuthWithin ("AUTH -" without a token:
//             accepted only when authentication is off)
//   server -> "OK\n", or "ERR <why>\n" and close.
//   reader -> "ARENA <pool> <kvcache.v1.StorageFormat number>\n"
//   server -> "OK <bytes> SEGMENTS <segment bytes>\n" (a host pool: the arena's reserved size;
//             map segment i at i * segment bytes), or
//             "OK <bytes> CUDA <device ordinal> <128 hex digits>\n" (a device pool dedicated
//             to the caller's tenant: the CUDA IPC handle of its one allocation, where every
//             format's arena starts; a reader must not write through it), or "ERR <why>\n".
//   reader -> "SEGMENT <pool> <format number> <index> <epoch>\n" (from a lease:
//             kvcache.v1.LeaseArena.segments)
//   server -> "OK <bytes>\n" with the segment's memfd attached (only while the segment holds
//             the caller's tenant's blocks with that memfd), or "ERR <why>\n".
//   writer -> "STAGE <bytes>\n" (a staging region for Appends, staging_regions.h; at most
//             kMaxRegionsPerConnection per connection, each closed with the connection,
//             usable only by the connection's tenant)
//   server -> "OK <region id> <bytes>\n" with the region's memfd attached (the writer maps it
//             writable), or "ERR <why>\n".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/store/lease_service.h"
#include "cachesvc/transport/staging_regions.h"

namespace kvc::cachesvc {

struct LocalSocketOptions {
  std::string path;         // filesystem path of the socket; a stale file there is replaced
  std::vector<uid_t> uids;  // peers allowed (kvcached's own uid only with allow_same_uid)
  bool allow_same_uid = false;
  std::string token;  // sent in the greeting
  // The scope (tenant) a bearer token acts in, or UNAUTHENTICATED; called for "AUTH" and to
  // re-check connections. "-" stands for no token.
  std::function<absl::StatusOr<TenantScope>(const std::string& token)> authenticate;
  // Called from the socket's thread for each "connected" (greeted), "refused" (uid or too
  // many readers), "authenticated", "revoked" (a connection closed because its token no
  // longer authenticates), "arena", "segment" (a segment fd handed out) and "staging" (a
  // staging region opened): the server counts them in metrics.
  std::function<void(const char* event)> on_event;
};

class LocalSocket {
 public:
  static constexpr size_t kMaxRegionsPerConnection = 4;
  static constexpr size_t kMaxConnections = 256;
  // A connection that has not authenticated by then is closed.
  static constexpr absl::Duration kAuthWithin = absl::Seconds(5);

  // Binds and starts serving. UNAVAILABLE when the path cannot be bound; INVALID_ARGUMENT
  // when no uid could ever connect. `regions` (outliving the socket) holds the staging
  // regions it opens.
  static absl::StatusOr<std::unique_ptr<LocalSocket>> Start(const LocalSocketOptions& options,
                                                            LeaseService* leases,
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
    absl::Time opened;
    bool authenticated = false;
    std::string token;                 // the bearer token it authenticated with ("-": none)
    TenantScope scope;                 // the tenant it acts for
    std::vector<std::string> regions;  // staging regions it opened: closed with it
  };
  LocalSocket(const LocalSocketOptions& options, LeaseService* leases, StagingRegions* regions)
      : options_(options), leases_(leases), regions_(regions) {}
  void Close(Conn& conn);
  // "OK <id> <bytes>" with the fd attached, or "ERR ..."; false: the connection failed.
  bool Stage(Conn& conn, const std::string& bytes);
  bool Auth(Conn& conn, const std::string& token);
  bool Arena(Conn& conn, const std::vector<std::string>& words);
  bool Segment(Conn& conn, const std::vector<std::string>& words);
  // Whether the connection's token still authenticates to the same scope.
  bool StillValid(const Conn& conn) const;
  void Serve();
  void Accept(std::vector<Conn>* conns);
  // Handles the complete lines in the connection's buffer; false: close it.
  bool Handle(Conn& conn);
  bool Allowed(int fd, uid_t* uid) const;
  void Event(const char* event) const {
    if (options_.on_event) options_.on_event(event);
  }

  const LocalSocketOptions options_;
  LeaseService* const leases_;
  StagingRegions* const regions_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the destructor wakes the poll loop
  std::thread thread_;
};

}  // namespace kvc::cachesvc
