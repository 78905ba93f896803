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
  return std::unique_ptr<LocalReader>(new LocalReader(fd, path, token));
}

LocalReader::~LocalReader() {
  kvc::MutexLock lock(&mu_);
  for (auto& [key, m] : maps_) ::munmap(const_cast<uint8_t*>(m.base), static_cast<size_t>(m.bytes));
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

absl::StatusOr<LocalReader::Mapping> LocalReader::Arena(const std::string& pool,
                                                        StorageFormat format) {
  kvc::MutexLock lock(&mu_);
  const auto key = std::make_pair(pool, static_cast<int>(format));
  if (auto it = maps_.find(key); it != maps_.end()) return it->second;
  int arena_fd = -1;
  absl::StatusOr<std::string> reply =
      Ask(absl::StrCat("ARENA ", pool, " ", static_cast<int>(format), "\n"), &arena_fd);
  if (!reply.ok()) return reply.status();
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
  if (words.size() == 2 && words[0] == "OK") {
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
    return absl::UnavailableError(absl::StrCat("local socket: ", Errno()));
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
        absl::StrCat("cannot map a staging region of ", bytes, " bytes: ", Errno()));
  }
  return std::make_unique<StagingSpace>(words[1], static_cast<uint8_t*>(p), bytes);
}

namespace {

size_t ElementBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// How far a read of `lane` goes: positions below the visible tokens, or below its layer's
// appended tokens with include_unfinished.
int64_t LaneLimit(const Lease& lease, const LeaseLane& lane, bool include_unfinished) {
  const auto at = static_cast<size_t>(
      std::find(lease.layers.begin(), lease.layers.end(), lane.layer) - lease.layers.begin());
  return include_unfinished && at < lease.layer_tokens.size() ? lease.layer_tokens[at]
                                                              : lease.visible_tokens;
}

// Calls on_run(first, count, keys, values) for each run of the segment's tokens that lie in
// one block and below `limit`: their K (and V) records are contiguous in the arena.
template <typename OnRun>
absl::Status ForEachRun(const LeaseSegment& seg, const LeaseArena& layout, const uint8_t* base,
                        int64_t arena_bytes, size_t block_tokens, int64_t limit, OnRun on_run) {
  const size_t rb = static_cast<size_t>(layout.record_bytes);
  const size_t n = seg.positions.size();
  for (size_t t = 0; t < n;) {
    const size_t slot = t % block_tokens;
    const size_t most = std::min(block_tokens - slot, n - t);
    size_t run = 0;
    while (run < most && seg.positions[t + run] < limit) ++run;
    if (run == 0) {
      ++t;
      continue;
    }
    const int64_t block = seg.blocks[t / block_tokens];
    if (block < 0 || (block + 1) * layout.block_bytes > arena_bytes) {
      return absl::InternalError(
          absl::StrCat("lease block ", block, " is outside the ", arena_bytes, "-byte arena"));
    }
    const uint8_t* b = base + block * layout.block_bytes;
    on_run(t, run, b + layout.key_offset + slot * rb, b + layout.value_offset + slot * rb);
    t += run;
  }
  return absl::OkStatus();
}

// memcpy without `rep movsb`: glibc copies a few KiB with it, which runs ~4x slower when the
// destination sits a few bytes past the source modulo 4 KiB (measured on this AMD EPYC VM:
// a malloc'd buffer starts 16 bytes into a page, arena records start on one). Fixed 64-byte
// copies compile to vector loads and stores, as fast as memcpy at every alignment.
void CopyBytes(char* to, const uint8_t* from, size_t bytes) {
  for (; bytes >= 64; bytes -= 64, to += 64, from += 64) std::memcpy(to, from, 64);
  std::memcpy(to, from, bytes);
}

// `count` records of `format` (stride rb) as dense rows of `dtype`: copied when the format is
// that dtype's raw one, else decoded (record_decode.h).
void WriteDense(StorageFormat format, DType dtype, int d, size_t rb, const uint8_t* records,
                size_t count, char* out) {
  if (format == RawFormatOf(dtype)) {
    CopyBytes(out, records, count * rb);
    return;
  }
  DecodeRecords(KernelFormat(format), KernelDType(dtype), d, rb, records, count, out);
}

// The lease must have been live for the whole read: a block of an expired lease may have been
// handed to another sequence meanwhile.
absl::Status CheckStillLeased(const Lease& lease) {
  if (absl::ToUnixMillis(absl::Now()) >= lease.expires_unix_ms) {
    return absl::AbortedError("the lease expired while it was read; fetch again");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LocalReader::ReadLeased(const Lease& lease, const FetchOptions& options,
                                     const std::function<absl::Status(FetchedChunk&)>& on_chunk) {
  if (absl::Status same = CheckSameServer(lease); !same.ok()) return same;
  const int d = lease.head_dim;
  const DType dtype = options.dtype == DType::kPoolDefault ? lease.dtype : options.dtype;
  const auto bt = static_cast<size_t>(lease.block_tokens);
  // One chunk, reused: its buffers keep their capacity from lane to lane (unless the caller
  // moves them out), so a large read does not fault in fresh pages for every lane.
  FetchedChunk chunk;
  for (const LeaseLane& lane : lease.lanes) {
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
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
      const size_t out_bytes =
          options.stored_format ? rb : static_cast<size_t>(d) * ElementBytes(dtype);
      chunk.record_bytes = options.stored_format ? static_cast<int>(rb) : 0;
      chunk.positions.clear();
      chunk.keys.clear();
      chunk.values.clear();
      chunk.keys.reserve(seg.positions.size() * out_bytes);
      chunk.values.reserve(seg.positions.size() * out_bytes);
      absl::Status walked = ForEachRun(
          seg, *layout, arena->base, arena->bytes, bt, limit,
          [&](size_t t, size_t run, const uint8_t* k, const uint8_t* v) {
            chunk.positions.insert(chunk.positions.end(),
                                   seg.positions.begin() + static_cast<std::ptrdiff_t>(t),
                                   seg.positions.begin() + static_cast<std::ptrdiff_t>(t + run));
            for (const auto& [rec, out] :
                 {std::make_pair(k, &chunk.keys), std::make_pair(v, &chunk.values)}) {
              const size_t at = out->size();
              out->resize(at + run * out_bytes);
              if (options.stored_format) {
                CopyBytes(out->data() + at, rec, run * rb);
              } else {
                WriteDense(seg.format, dtype, d, rb, rec, run, out->data() + at);
              }
            }
          });
      if (!walked.ok()) return walked;
      chunk.num_tokens = static_cast<int>(chunk.positions.size());
      if (chunk.num_tokens == 0) continue;
      chunk.first_index = sent;
      sent += chunk.num_tokens;
      if (absl::Status s = CheckStillLeased(lease); !s.ok()) return s;
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalReader::ReadLeasedInto(const Lease& lease,
                                         const std::vector<LayerBuffers>& buffers,
                                         const FetchIntoOptions& options, FetchIntoResult* result) {
  if (absl::Status same = CheckSameServer(lease); !same.ok()) return same;
  const int d = lease.head_dim;
  const size_t heads = static_cast<size_t>(options.num_kv_heads);
  if (d != options.head_dim || lease.layers.size() != buffers.size() ||
      lease.lanes.size() != buffers.size() * heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the buffers are for ", options.num_kv_heads, " kv heads x head_dim ", options.head_dim,
        " but the sequence has ",
        lease.layers.empty() ? 0 : lease.lanes.size() / lease.layers.size(), " x ", d));
  }
  const auto bt = static_cast<size_t>(lease.block_tokens);
  // Lane i is buffer i / heads, head i % heads (the lease lists lanes layer-major, layers in
  // request order, which is the buffers' order). Count first: nothing is written when a lane
  // does not fit.
  std::vector<int64_t> counts(lease.lanes.size(), 0);
  for (size_t i = 0; i < lease.lanes.size(); ++i) {
    const LeaseLane& lane = lease.lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    if (lane.layer != buffer.layer || static_cast<size_t>(lane.kv_head) != i % heads) {
      return absl::InternalError("the lease's lanes are not in the requested order");
    }
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
    for (const LeaseSegment& seg : lane.segments) {
      counts[i] += std::count_if(seg.positions.begin(), seg.positions.end(),
                                 [limit](int32_t p) { return p < limit; });
    }
    if (counts[i] > buffer.capacity_tokens) {
      return absl::OutOfRangeError(absl::StrCat("layer ", lane.layer, " kv head ", lane.kv_head,
                                                " holds ", counts[i], " tokens; its buffers hold ",
                                                buffer.capacity_tokens));
    }
  }
  const size_t row = static_cast<size_t>(d) * ElementBytes(options.dtype);
  for (size_t i = 0; i < lease.lanes.size(); ++i) {
    const LeaseLane& lane = lease.lanes[i];
    const LayerBuffers& buffer = buffers[i / heads];
    const size_t lane_offset = (i % heads) * static_cast<size_t>(buffer.capacity_tokens) * row;
    char* keys = static_cast<char*>(buffer.keys) + lane_offset;
    char* values = static_cast<char*>(buffer.values) + lane_offset;
    const int64_t limit = LaneLimit(lease, lane, options.include_unfinished);
    size_t written = 0;
    for (const LeaseSegment& seg : lane.segments) {
      const LeaseArena* layout = lease.arena(seg.format);
      if (layout == nullptr) return absl::InternalError("the lease names no arena for a segment");
      absl::StatusOr<Mapping> arena = Arena(lease.pool, seg.format);
      if (!arena.ok()) return arena.status();
      const size_t rb = static_cast<size_t>(layout->record_bytes);
      absl::Status walked = ForEachRun(
          seg, *layout, arena->base, arena->bytes, bt, limit,
          [&](size_t t, size_t run, const uint8_t* k, const uint8_t* v) {
            WriteDense(seg.format, options.dtype, d, rb, k, run, keys + written * row);
            WriteDense(seg.format, options.dtype, d, rb, v, run, values + written * row);
            if (options.positions) {
              result->positions.insert(
                  result->positions.end(), seg.positions.begin() + static_cast<std::ptrdiff_t>(t),
                  seg.positions.begin() + static_cast<std::ptrdiff_t>(t + run));
            }
            written += run;
          });
      if (!walked.ok()) return walked;
    }
    result->lane_tokens.push_back(static_cast<int64_t>(written));
  }
  result->visible_tokens = lease.visible_tokens;
  return CheckStillLeased(lease);
}

}  // namespace kvc::client::internal
