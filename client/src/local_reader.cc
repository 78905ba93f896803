#include "client/src/local_reader.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/decode/record_decode.h"
#include "client/src/kernel_types.h"
#include "common/errno_message.h"

namespace kvc::client::internal {
namespace {

// One reply line, and the fd sent with it (-1 if none).
absl::StatusOr<std::string> ReadLine(int fd, int* passed_fd) {
  std::string line;
  *passed_fd = -1;
  while (line.empty() || line.back() != '\n') {
    char c = 0;
    msghdr msg{};
    iovec iov{&c, 1};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) {
      if (*passed_fd >= 0) ::close(*passed_fd);
      return absl::UnavailableError(n == 0 ? "the local socket closed"
                                           : absl::StrCat("local socket: ", ErrnoMessage()));
    }
    for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
        std::memcpy(passed_fd, CMSG_DATA(h), sizeof(int));
      }
    }
    line.push_back(c);
    if (line.size() > 512) return absl::InternalError("local socket: reply line too long");
  }
  line.pop_back();
  return line;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalReader>> LocalReader::Connect(const std::string& path,
                                                                  const std::string& token,
                                                                  const std::string& bearer_token) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("local socket path '", path, "' is invalid"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoMessage()));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string why = ErrnoMessage();
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", path, ": ", why));
  }
  // A server that stops answering must not hang the client: replies are immediate.
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int unused = -1;
  absl::StatusOr<std::string> greeting = ReadLine(fd, &unused);
  if (unused >= 0) ::close(unused);
  if (!greeting.ok()) {
    ::close(fd);
    return greeting.status();
  }
  if (*greeting != absl::StrCat("KVC-LOCAL 2 ", token)) {
    ::close(fd);
    if (absl::StartsWith(*greeting, "ERR ")) {
      return absl::FailedPreconditionError(absl::StrCat(path, " refused: ", greeting->substr(4)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is another server's (its greeting carries another token)"));
  }
  // The same credential as the gRPC calls: it decides whose segments this connection maps.
  std::unique_ptr<LocalReader> reader(new LocalReader(fd, path, token));
  {
    kvc::MutexLock lock(&reader->mu_);
    int unused_fd = -1;
    absl::StatusOr<std::string> reply = reader->Ask(
        absl::StrCat("AUTH ", bearer_token.empty() ? "-" : bearer_token, "\n"), &unused_fd);
    if (unused_fd >= 0) ::close(unused_fd);
    if (!reply.ok()) return reply.status();
    if (*reply != "OK") {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " refused this client's credential: ",
                       absl::StartsWith(*reply, "ERR ") ? reply->substr(4, 200) : "no answer"));
    }
  }
  return reader;
}

LocalReader::~LocalReader() {
  kvc::MutexLock lock(&mu_);
  for (auto& [key, m] : maps_) ::munmap(m.base, static_cast<size_t>(m.bytes));
  if (fd_ >= 0) ::close(fd_);
}

bool LocalReader::Alive() {
  if (stale_.load(std::memory_order_relaxed)) return false;
  kvc::MutexLock lock(&mu_);
  if (fd_ < 0) return false;
  // The server never writes unasked: readable means end of file (or garbage), as bad as a
  // hang-up.
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

absl::Status LocalReader::CheckSameServer(const Lease& lease) {
  if (lease.local_token == token_) return absl::OkStatus();
  stale_.store(true, std::memory_order_relaxed);
  return absl::UnimplementedError(
      "the lease is from another server than the local socket's (it restarted?)");
}

absl::StatusOr<ArenaView> LocalReader::Arena(const std::string& pool, StorageFormat format,
                                             const LeaseArena* leased) {
  kvc::MutexLock lock(&mu_);
  const auto key = std::make_pair(pool, static_cast<int>(format));
  auto it = maps_.find(key);
  if (it == maps_.end()) {
    int unused_fd = -1;
    absl::StatusOr<std::string> reply =
        Ask(absl::StrCat("ARENA ", pool, " ", static_cast<int>(format), "\n"), &unused_fd);
    if (unused_fd >= 0) ::close(unused_fd);
    if (!reply.ok()) return reply.status();
    // "OK <bytes> SEGMENTS <segment bytes>"
    const std::vector<std::string> words = absl::StrSplit(*reply, ' ');
    Mapped m;
    if (words.size() != 4 || words[0] != "OK" || words[2] != "SEGMENTS" ||
        !absl::SimpleAtoi(words[1], &m.bytes) || !absl::SimpleAtoi(words[3], &m.segment_bytes) ||
        m.bytes <= 0 || m.segment_bytes <= 0 || m.bytes % m.segment_bytes != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool '", pool, "' cannot be mapped: ", reply->substr(0, 200)));
    }
    // Address space only: a segment becomes readable when it is mapped below, and anything
    // else faults instead of showing bytes.
    void* p = ::mmap(nullptr, static_cast<size_t>(m.bytes), PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot reserve ", m.bytes, " bytes for pool '", pool, "': ", ErrnoMessage()));
    }
    m.base = static_cast<uint8_t*>(p);
    m.epochs.assign(static_cast<size_t>(m.bytes / m.segment_bytes), 0);
    it = maps_.emplace(key, std::move(m)).first;
  }
  Mapped& m = it->second;
  if (leased != nullptr) {
    for (const LeaseArenaSegment& seg : leased->segments) {
      if (seg.index < 0 || seg.index >= static_cast<int64_t>(m.epochs.size())) {
        return absl::InternalError(absl::StrCat("the lease names segment ", seg.index,
                                                " outside the arena of pool '", pool, "'"));
      }
      if (m.epochs[static_cast<size_t>(seg.index)] == seg.epoch) continue;
      int segment_fd = -1;
      absl::StatusOr<std::string> reply =
          Ask(absl::StrCat("SEGMENT ", pool, " ", static_cast<int>(format), " ", seg.index, " ",
                           seg.epoch, "\n"),
              &segment_fd);
      if (!reply.ok()) return reply.status();
      int64_t bytes = 0;
      if (!absl::StartsWith(*reply, "OK ") || segment_fd < 0 ||
          !absl::SimpleAtoi(reply->substr(3), &bytes) || bytes != m.segment_bytes) {
        if (segment_fd >= 0) ::close(segment_fd);
        return absl::FailedPreconditionError(
            absl::StrCat("segment ", seg.index, " of pool '", pool,
                         "' cannot be mapped: ", reply->substr(0, 200)));
      }
      // In place of whatever was there (nothing, or the segment's earlier memory).
      void* p = ::mmap(m.base + seg.index * m.segment_bytes, static_cast<size_t>(bytes), PROT_READ,
                       MAP_SHARED | MAP_FIXED, segment_fd, 0);
      ::close(segment_fd);  // the mapping keeps the memory
      if (p == MAP_FAILED) {
        m.epochs[static_cast<size_t>(seg.index)] = 0;
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot map a segment of pool '", pool, "': ", ErrnoMessage()));
      }
      m.epochs[static_cast<size_t>(seg.index)] = seg.epoch;
    }
  }
  return ArenaView{m.base, m.bytes};
}

absl::StatusOr<DeviceArenaHandle> LocalReader::DeviceArena(const std::string& pool,
                                                           StorageFormat format) {
  kvc::MutexLock lock(&mu_);
  int arena_fd = -1;
  absl::StatusOr<std::string> reply =
      Ask(absl::StrCat("ARENA ", pool, " ", static_cast<int>(format), "\n"), &arena_fd);
  if (arena_fd >= 0) ::close(arena_fd);  // a host pool's memfd: not what was asked for
  if (!reply.ok()) return reply.status();
  // "OK <bytes> CUDA <device> <128 hex digits>"
  const std::vector<std::string> words = absl::StrSplit(*reply, ' ');
  DeviceArenaHandle h;
  if (words.size() == 5 && words[0] == "OK" && words[2] == "CUDA" &&
      absl::SimpleAtoi(words[1], &h.bytes) && absl::SimpleAtoi(words[3], &h.device) &&
      words[4].size() == 2 * h.cuda_ipc.size() &&
      std::all_of(words[4].begin(), words[4].end(),
                  [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); }) &&
      h.bytes > 0 && h.device >= 0) {
    const std::string raw = absl::HexStringToBytes(words[4]);
    std::memcpy(h.cuda_ipc.data(), raw.data(), h.cuda_ipc.size());
    h.server_token = token_;
    return h;
  }
  if (words.size() == 4 && words[0] == "OK" && words[2] == "SEGMENTS") {
    return absl::FailedPreconditionError(
        absl::StrCat("pool '", pool, "' is a host pool (no CUDA IPC handle)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("pool '", pool, "' cannot be shared: ", reply->substr(0, 200)));
}

absl::StatusOr<std::string> LocalReader::Ask(const std::string& request, int* passed_fd) {
  *passed_fd = -1;
  if (fd_ < 0) return absl::UnavailableError("the local socket broke earlier");
  if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd_);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat("local socket: ", ErrnoMessage()));
  }
  absl::StatusOr<std::string> reply = ReadLine(fd_, passed_fd);
  if (!reply.ok()) {
    ::close(fd_);
    fd_ = -1;
  }
  return reply;
}

absl::StatusOr<std::unique_ptr<StagingSpace>> LocalReader::OpenStaging(int64_t bytes) {
  kvc::MutexLock lock(&mu_);
  int region_fd = -1;
  absl::StatusOr<std::string> reply = Ask(absl::StrCat("STAGE ", bytes, "\n"), &region_fd);
  if (!reply.ok()) return reply.status();
  const std::vector<std::string> words = absl::StrSplit(*reply, ' ');
  int64_t got = 0;
  if (words.size() != 3 || words[0] != "OK" || region_fd < 0 || !absl::SimpleAtoi(words[2], &got) ||
      got != bytes) {
    if (region_fd >= 0) ::close(region_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("no staging region: ", reply->substr(0, 200)));
  }
  void* p =
      ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
  ::close(region_fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a staging region of ", bytes, " bytes: ", ErrnoMessage()));
  }
  return std::make_unique<StagingSpace>(words[1], static_cast<uint8_t*>(p), bytes);
}

absl::StatusOr<ArenaLookup> LocalReader::MapLease(const Lease& lease) {
  // Every segment the lease names, mapped once before the reads (which then take no lock).
  std::map<int, ArenaView> views;
  for (const LeaseArena& a : lease.arenas) {
    absl::StatusOr<ArenaView> view = Arena(lease.pool, a.format, &a);
    if (!view.ok()) {
      // Nothing was read yet: the caller reads over gRPC (which says why if it is refused
      // there too, e.g. a revoked credential) and decides its path again next time.
      stale_.store(true, std::memory_order_relaxed);
      return absl::UnimplementedError(
          absl::StrCat("the lease cannot be mapped here: ", view.status().message()));
    }
    views[static_cast<int>(a.format)] = *view;
  }
  return ArenaLookup([views = std::move(views)](StorageFormat f) -> absl::StatusOr<ArenaView> {
    auto it = views.find(static_cast<int>(f));
    if (it == views.end()) return absl::InternalError("the lease names no arena for a segment");
    return it->second;
  });
}

absl::StatusOr<ArenaLookup> LocalReader::Map(const Lease& lease) {
  if (absl::Status same = CheckSameServer(lease); !same.ok()) return same;
  return MapLease(lease);
}

}  // namespace kvc::client::internal
