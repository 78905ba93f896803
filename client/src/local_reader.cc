#include "client/src/local_reader.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvc/kernels/dtype.h"
#include "kvc/kernels/record_codec.h"

namespace kvc::client::internal {
namespace {

std::string Errno() { return std::generic_category().message(errno); }

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
                                           : absl::StrCat("local socket: ", Errno()));
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

kernels::StorageFormat KernelFormat(StorageFormat f) {
  switch (f) {
    case StorageFormat::kF32:
      return kernels::StorageFormat::kF32;
    case StorageFormat::kBF16:
      return kernels::StorageFormat::kBF16;
    case StorageFormat::kFp8E4M3:
      return kernels::StorageFormat::kFp8E4M3;
    case StorageFormat::kInt8:
      return kernels::StorageFormat::kInt8;
    case StorageFormat::kInt4G32:
      return kernels::StorageFormat::kInt4G32;
    case StorageFormat::kInt4G64:
      return kernels::StorageFormat::kInt4G64;
    case StorageFormat::kNvfp4:
      return kernels::StorageFormat::kNvfp4;
    default:
      return kernels::StorageFormat::kF16;
  }
}

kernels::DType KernelDType(DType d) {
  switch (d) {
    case DType::kF32:
      return kernels::DType::kF32;
    case DType::kBF16:
      return kernels::DType::kBF16;
    default:
      return kernels::DType::kF16;
  }
}

// The raw storage format whose records are exactly dense elements of `d`.
StorageFormat RawFormatOf(DType d) {
  switch (d) {
    case DType::kF32:
      return StorageFormat::kF32;
    case DType::kBF16:
      return StorageFormat::kBF16;
    default:
      return StorageFormat::kF16;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalReader>> LocalReader::Connect(const std::string& path,
                                                                  const std::string& token) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("local socket path '", path, "' is invalid"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", Errno()));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const std::string why = Errno();
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
  if (*greeting != absl::StrCat("KVC-LOCAL 1 ", token)) {
    ::close(fd);
    if (absl::StartsWith(*greeting, "ERR ")) {
      return absl::FailedPreconditionError(absl::StrCat(path, " refused: ", greeting->substr(4)));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is another server's (its greeting carries another token)"));
  }
  return std::unique_ptr<LocalReader>(new LocalReader(fd, path));
}

LocalReader::~LocalReader() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, m] : maps_) ::munmap(const_cast<uint8_t*>(m.base), static_cast<size_t>(m.bytes));
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<LocalReader::Mapping> LocalReader::Arena(const std::string& pool,
                                                        StorageFormat format) {
  absl::MutexLock lock(&mu_);
  const auto key = std::make_pair(pool, static_cast<int>(format));
  if (auto it = maps_.find(key); it != maps_.end()) return it->second;
  if (fd_ < 0) return absl::UnavailableError("the local socket broke earlier");
  const std::string request = absl::StrCat("ARENA ", pool, " ", static_cast<int>(format), "\n");
  if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd_);
    fd_ = -1;
    return absl::UnavailableError(absl::StrCat("local socket: ", Errno()));
  }
  int arena_fd = -1;
  absl::StatusOr<std::string> reply = ReadLine(fd_, &arena_fd);
  if (!reply.ok()) {
    ::close(fd_);
    fd_ = -1;
    return reply.status();
  }
  int64_t bytes = 0;
  if (!absl::StartsWith(*reply, "OK ") || arena_fd < 0 ||
      !absl::SimpleAtoi(reply->substr(3), &bytes) || bytes <= 0) {
    if (arena_fd >= 0) ::close(arena_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("pool '", pool, "' cannot be mapped: ", reply->substr(0, 200)));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, arena_fd, 0);
  ::close(arena_fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map pool '", pool, "' (", bytes, " bytes): ", Errno()));
  }
  Mapping m{static_cast<const uint8_t*>(p), bytes};
  maps_[key] = m;
  return m;
}

absl::Status LocalReader::ReadLeased(const Lease& lease, const FetchOptions& options,
                                     const std::function<absl::Status(FetchedChunk&)>& on_chunk) {
  const int d = lease.head_dim;
  const DType dtype = options.dtype == DType::kPoolDefault ? lease.dtype : options.dtype;
  const size_t elem = dtype == DType::kF32 ? 4 : 2;
  std::vector<float> scratch(static_cast<size_t>(d));
  const auto bt = static_cast<size_t>(lease.block_tokens);
  // One chunk, reused: its buffers keep their capacity from lane to lane (unless the caller
  // moves them out), so a large read does not fault in fresh pages for every lane.
  FetchedChunk chunk;
  for (const LeaseLane& lane : lease.lanes) {
    const size_t layer_index = static_cast<size_t>(
        std::find(lease.layers.begin(), lease.layers.end(), lane.layer) - lease.layers.begin());
    const int64_t limit = options.include_unfinished && layer_index < lease.layer_tokens.size()
                              ? lease.layer_tokens[layer_index]
                              : lease.visible_tokens;
    int64_t sent = 0;  // tokens of this lane in earlier chunks
    for (const LeaseSegment& seg : lane.segments) {
      const LeaseArena* layout = lease.arena(seg.format);
      if (layout == nullptr) return absl::InternalError("the lease names no arena for a segment");
      absl::StatusOr<Mapping> arena = Arena(lease.pool, seg.format);
      if (!arena.ok()) return arena.status();
      chunk.layer = lane.layer;
      chunk.kv_head = lane.kv_head;
      chunk.storage = seg.format;
      chunk.visible_tokens = lease.visible_tokens;
      chunk.dtype = dtype;  // as gRPC: the dense dtype, also beside stored records
      const size_t rb = static_cast<size_t>(layout->record_bytes);
      const size_t out_bytes = options.stored_format ? rb : static_cast<size_t>(d) * elem;
      chunk.record_bytes = options.stored_format ? static_cast<int>(rb) : 0;
      chunk.positions.clear();
      chunk.keys.clear();
      chunk.values.clear();
      chunk.keys.reserve(seg.positions.size() * out_bytes);
      chunk.values.reserve(seg.positions.size() * out_bytes);
      const bool copy = options.stored_format || seg.format == RawFormatOf(dtype);
      const size_t n = seg.positions.size();
      for (size_t t = 0; t < n;) {
        // A run of tokens in one block, all below the limit: their records are contiguous.
        const size_t slot = t % bt;
        const size_t most = std::min(bt - slot, n - t);
        size_t run = 0;
        while (run < most && seg.positions[t + run] < limit) ++run;
        if (run == 0) {
          ++t;
          continue;
        }
        const int64_t block = seg.blocks[t / bt];
        if (block < 0 || (block + 1) * layout->block_bytes > arena->bytes) {
          return absl::InternalError(
              absl::StrCat("lease block ", block, " is outside the ", arena->bytes, "-byte arena"));
        }
        const uint8_t* base = arena->base + block * layout->block_bytes;
        const uint8_t* k = base + layout->key_offset + slot * rb;
        const uint8_t* v = base + layout->value_offset + slot * rb;
        chunk.positions.insert(chunk.positions.end(),
                               seg.positions.begin() + static_cast<std::ptrdiff_t>(t),
                               seg.positions.begin() + static_cast<std::ptrdiff_t>(t + run));
        if (copy) {
          chunk.keys.append(reinterpret_cast<const char*>(k), run * rb);
          chunk.values.append(reinterpret_cast<const char*>(v), run * rb);
        } else {
          for (const auto& [rec, out] :
               {std::make_pair(k, &chunk.keys), std::make_pair(v, &chunk.values)}) {
            for (size_t r = 0; r < run; ++r) {
              kernels::DequantizeRecord(KernelFormat(seg.format), d, rec + r * rb, scratch.data());
              const size_t at = out->size();
              out->resize(at + out_bytes);
              for (int j = 0; j < d; ++j) {
                kernels::StoreElement(out->data() + at, KernelDType(dtype), static_cast<size_t>(j),
                                      scratch[static_cast<size_t>(j)]);
              }
            }
          }
        }
        t += run;
      }
      chunk.num_tokens = static_cast<int>(chunk.positions.size());
      if (chunk.num_tokens == 0) continue;
      chunk.first_index = sent;
      sent += chunk.num_tokens;
      // The lease must have been live for the whole read: a block of an expired lease may
      // have been handed to another sequence meanwhile.
      if (absl::ToUnixMillis(absl::Now()) >= lease.expires_unix_ms) {
        return absl::AbortedError("the lease expired while it was read; fetch again");
      }
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvc::client::internal
