#include "cachesvc/transport/local_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/errno_message.h"
#include "common/logging.h"

namespace kvc::cachesvc {
namespace {

constexpr size_t kMaxLine = 512;

bool SendAll(int fd, const std::string& text, int attach_fd = -1) {
  msghdr msg{};
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (attach_fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &attach_fd, sizeof(int));
  }
  // Replies are a few dozen bytes: a unix stream socket takes them whole or fails.
  return ::sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalSocket>> LocalSocket::Start(const LocalSocketOptions& options,
                                                                LeaseService* leases,
                                                                StagingRegions* regions) {
  if (options.uids.empty() && !options.allow_same_uid) {
    return absl::InvalidArgumentError(
        "local_socket admits no uid: list the engines' uids in local_socket_uids (kvcached's "
        "own uid is admitted only with local_socket_allow_same_uid)");
  }
  if (!options.authenticate) return absl::InvalidArgumentError("local_socket: no authenticator");
  std::unique_ptr<LocalSocket> s(new LocalSocket(options, leases, regions));
  sockaddr_un addr{};
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_socket path must be 1-", sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, options.path.data(), options.path.size());
  s->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoMessage()));
  // A socket file nobody accepts on is a stale one of an earlier run: replace it. One a live
  // process accepts on belongs to another kvcached (a second server with the same path would
  // otherwise take it over, and the first one's readers would be refused by token).
  {
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) ::close(probe);
    if (live) {
      return absl::FailedPreconditionError(
          absl::StrCat("local_socket '", options.path,
                       "' is in use: another process (another kvcached?) accepts connections "
                       "on it; give each server its own path"));
    }
  }
  ::unlink(options.path.c_str());
  // connect(2) needs write permission on the socket file, which bind gave kvcached's umask
  // (0755 by default: no other uid could connect, and local_socket_uids would refuse nobody
  // only because nobody got in). Every uid may connect; Accept decides by the peer's uid.
  if (::bind(s->listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::chmod(options.path.c_str(), 0666) != 0 || ::listen(s->listen_fd_, 64) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on local_socket '", options.path, "': ", ErrnoMessage()));
  }
  s->wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (s->wake_fd_ < 0) return absl::UnavailableError(absl::StrCat("eventfd: ", ErrnoMessage()));
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

LocalSocket::~LocalSocket() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(options_.path.c_str());
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool LocalSocket::Allowed(int fd, uid_t* uid) const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  *uid = cred.uid;
  if (cred.uid == ::geteuid()) return options_.allow_same_uid;
  return std::find(options_.uids.begin(), options_.uids.end(), cred.uid) != options_.uids.end();
}

void LocalSocket::Accept(std::vector<Conn>* conns) {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  uid_t uid = 0;
  if (!Allowed(fd, &uid)) {
    Event("refused");
    SendAll(fd, absl::StrCat("ERR uid ", uid,
                             uid == ::geteuid()
                                 ? " is kvcached's own uid, which may not connect "
                                   "(local_socket_allow_same_uid)\n"
                                 : " may not map this server's pools (local_socket_uids)\n"));
    ::close(fd);
    return;
  }
  if (conns->size() >= kMaxConnections) {
    Event("refused");
    SendAll(fd, "ERR too many local readers connected\n");
    ::close(fd);
    return;
  }
  if (!SendAll(fd, absl::StrCat("KVC-LOCAL 2 ", options_.token, "\n"))) {
    ::close(fd);
    return;
  }
  Event("connected");
  Conn conn;
  conn.fd = fd;
  conn.opened = absl::Now();
  conns->push_back(std::move(conn));
}

bool LocalSocket::StillValid(const Conn& conn) const {
  const absl::StatusOr<TenantScope> scope = options_.authenticate(conn.token);
  return scope.ok() && *scope == conn.scope;
}

bool LocalSocket::Auth(Conn& conn, const std::string& token) {
  if (conn.authenticated) {
    SendAll(conn.fd, "ERR this connection has authenticated already\n");
    return false;
  }
  const absl::StatusOr<TenantScope> scope = options_.authenticate(token);
  if (!scope.ok()) {
    Event("refused");
    SendAll(conn.fd, absl::StrCat("ERR ", scope.status().message().substr(0, 200), "\n"));
    return false;
  }
  conn.authenticated = true;
  conn.token = token;
  conn.scope = *scope;
  Event("authenticated");
  return SendAll(conn.fd, "OK\n");
}

namespace {

// A kvcache.v1.StorageFormat number (what the socket's requests carry, as leases do) as the
// core's format: the contract counts from UNSPECIFIED = 0, the kernels from F32 = 0.
absl::StatusOr<StorageFormat> ParseFormat(const std::string& word) {
  int number = 0;
  if (!absl::SimpleAtoi(word, &number) || number < 1 || number > kernels::kNumStorageFormats) {
    return absl::InvalidArgumentError("unknown storage format");
  }
  return static_cast<StorageFormat>(number - 1);
}

}  // namespace

bool LocalSocket::Arena(Conn& conn, const std::vector<std::string>& words) {
  const absl::StatusOr<StorageFormat> format = ParseFormat(words[2]);
  const absl::StatusOr<SharedArena> arena =
      format.ok() ? leases_->ShareArena(words[1], *format, conn.scope) : format.status();
  if (!arena.ok()) {
    return SendAll(conn.fd, absl::StrCat("ERR ", arena.status().message().substr(0, 200), "\n"));
  }
  const std::string reply =
      arena->segment_bytes > 0
          ? absl::StrCat("OK ", arena->bytes, " SEGMENTS ", arena->segment_bytes, "\n")
          : absl::StrCat("OK ", arena->bytes, " CUDA ", arena->device, " ",
                         absl::BytesToHexString(
                             absl::string_view(reinterpret_cast<const char*>(arena->cuda_ipc.bytes),
                                               sizeof(arena->cuda_ipc.bytes))),
                         "\n");
  if (!SendAll(conn.fd, reply)) return false;
  Event("arena");
  return true;
}

bool LocalSocket::Segment(Conn& conn, const std::vector<std::string>& words) {
  int64_t index = 0;
  uint64_t epoch = 0;
  absl::StatusOr<UniqueFd> fd = absl::InvalidArgumentError("SEGMENT takes an index and an epoch");
  if (absl::SimpleAtoi(words[3], &index) && absl::SimpleAtoi(words[4], &epoch)) {
    absl::StatusOr<StorageFormat> format = ParseFormat(words[2]);
    fd = format.ok() ? leases_->ShareSegment(words[1], *format, conn.scope, index, epoch)
                     : format.status();
  }
  if (!fd.ok()) {
    return SendAll(conn.fd, absl::StrCat("ERR ", fd.status().message().substr(0, 200), "\n"));
  }
  struct stat st {};
  const int64_t bytes = ::fstat(fd->get(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
  if (!SendAll(conn.fd, absl::StrCat("OK ", bytes, "\n"), fd->get())) return false;
  Event("segment");
  return true;
}

bool LocalSocket::Handle(Conn& conn) {
  for (size_t end; (end = conn.buffer.find('\n')) != std::string::npos;) {
    const std::string line = conn.buffer.substr(0, end);
    conn.buffer.erase(0, end + 1);
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() == 2 && words[0] == "AUTH") {
      if (!Auth(conn, words[1])) return false;
      continue;
    }
    if (!conn.authenticated) {
      SendAll(conn.fd, "ERR authenticate first: AUTH <bearer token> (AUTH - without one)\n");
      return false;
    }
    // A token revoked since the last sweep reaches nothing more.
    if (!StillValid(conn)) {
      Event("revoked");
      SendAll(conn.fd, "ERR the connection's credential is no longer valid\n");
      return false;
    }
    bool ok = true;
    if (words.size() == 2 && words[0] == "STAGE") {
      ok = Stage(conn, words[1]);
    } else if (words.size() == 3 && words[0] == "ARENA") {
      ok = Arena(conn, words);
    } else if (words.size() == 5 && words[0] == "SEGMENT") {
      ok = Segment(conn, words);
    } else {
      SendAll(conn.fd,
              "ERR expected: ARENA <pool> <format> | SEGMENT <pool> <format> <index> <epoch> | "
              "STAGE <bytes>\n");
      return false;
    }
    if (!ok) return false;
  }
  return conn.buffer.size() <= kMaxLine;
}

bool LocalSocket::Stage(Conn& conn, const std::string& bytes) {
  int64_t n = 0;
  absl::StatusOr<std::pair<std::string, std::shared_ptr<StagingRegion>>> region =
      absl::InvalidArgumentError("STAGE takes a byte count");
  if (conn.regions.size() >= kMaxRegionsPerConnection) {
    region = absl::ResourceExhaustedError(absl::StrCat("this connection has ", conn.regions.size(),
                                                       " staging regions open (the most)"));
  } else if (absl::SimpleAtoi(bytes, &n)) {
    region = regions_->Open(n, conn.scope);
  }
  if (!region.ok()) {
    return SendAll(conn.fd, absl::StrCat("ERR ", region.status().message().substr(0, 200), "\n"));
  }
  conn.regions.push_back(region->first);
  if (!SendAll(conn.fd, absl::StrCat("OK ", region->first, " ", n, "\n"), region->second->fd())) {
    return false;
  }
  Event("staging");
  return true;
}

void LocalSocket::Close(Conn& conn) {
  for (const std::string& id : conn.regions) regions_->Close(id);
  ::close(conn.fd);
}

void LocalSocket::Serve() {
  std::vector<Conn> conns;
  absl::Time swept = absl::Now();
  for (;;) {
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    // Wakes at least once a second to re-check tokens and drop silent connections.
    if (::poll(fds.data(), fds.size(), 1000) < 0) {
      if (errno == EINTR) continue;
      KVC_LOG(ERROR) << "local_socket: poll failed: " << ErrnoMessage();
      break;
    }
    if (fds[0].revents != 0) break;
    std::vector<Conn> kept;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = fds[i + 2].revents;
      bool keep = true;
      if (ev & POLLIN) {
        char buf[1024];
        const ssize_t n = ::read(c.fd, buf, sizeof(buf));
        keep = n > 0;
        if (keep) {
          c.buffer.append(buf, static_cast<size_t>(n));
          keep = Handle(c);
        }
      } else if (ev & (POLLHUP | POLLERR | POLLNVAL)) {
        keep = false;
      }
      const absl::Time now = absl::Now();
      if (keep && !c.authenticated && now - c.opened > kAuthWithin) {
        SendAll(c.fd, "ERR no AUTH in time\n");
        keep = false;
      }
      if (keep && c.authenticated && now - swept >= absl::Seconds(1) && !StillValid(c)) {
        Event("revoked");
        SendAll(c.fd, "ERR the connection's credential is no longer valid\n");
        keep = false;
      }
      if (keep) {
        kept.push_back(std::move(c));
      } else {
        Close(c);
      }
    }
    conns = std::move(kept);
    if (absl::Now() - swept >= absl::Seconds(1)) swept = absl::Now();
    if (fds[1].revents & POLLIN) Accept(&conns);  // after the loop: fds holds the old ones
  }
  for (Conn& c : conns) Close(c);
}

}  // namespace kvc::cachesvc
