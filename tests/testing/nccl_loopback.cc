// libkvc_nccl_loopback.so: a stand-in for libnccl with NCCL's C ABI for what
// transfer/nccl_api.h loads, for two ranks on ONE machine. Real NCCL refuses two ranks on one
// GPU (NVIDIA/nccl#418), and CI has no GPU at all, so NCCL transfer channels are tested
// against this library: on cudasim (its CUDA calls resolve to the simulator linked into the
// executable, which exports it) and on a one-GPU machine (linked to libcudart).
//
// What it keeps of NCCL: the unique id made by rank 0's process (a bootstrap address, here an
// abstract unix socket), a join that waits for both ranks (nonblocking with a config's
// blocking = 0: kInProgress until joined, ncclCommGetAsyncError says when, ncclCommAbort
// gives up), ncclSend/ncclRecv of bytes between DEVICE buffers only (a host pointer is
// ncclInvalidArgument, as NCCL refuses it), matched in call order, and an error once a peer
// goes away, and sends and receives that must match in size (a mismatch is
// ncclInvalidUsage on the receiving side). What differs: a send or receive synchronizes its
// stream and then moves the bytes (on the comm's own thread when nonblocking, kInProgress
// until done) instead of being enqueued on the stream, so synchronizing the stream
// afterwards waits for nothing; one connection carries everything; only ncclUint8 payloads
// between ranks 0 and 1.
#include <cuda_runtime.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kSuccess = 0, kUnhandledCudaError = 1, kSystemError = 2, kInvalidArgument = 4,
              kInvalidUsage = 5, kRemoteError = 6, kInProgress = 7;
constexpr char kMagic[8] = {'K', 'V', 'C', 'L', 'O', 'O', 'P', '1'};
constexpr size_t kPiece = size_t{4} << 20;

struct UniqueId {
  char internal[128];
};
struct Config {  // the v2.14 prefix (transfer/nccl_api.h)
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};

// Listening sockets of the ids this process made, by name: rank 0 accepts on one.
std::mutex g_ids_mu;
std::map<std::string, int>& Ids() {
  static auto* ids = new std::map<std::string, int>();
  return *ids;
}

sockaddr_un Address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // abstract: sun_path[0] = 0
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

bool IoAll(int fd, char* p, size_t n, bool write) {
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

struct ncclComm {  // NOLINT(readability-identifier-naming): NCCL's ABI name
  int rank = 0;
  std::atomic<int> state{kInProgress};  // what ncclCommGetAsyncError answers
  std::atomic<bool> aborted{false};
  bool blocking = true;
  std::atomic<int> fd{-1};
  std::thread join;
  std::thread op;  // nonblocking: the send or receive in progress (one at a time, as in NCCL)
};

namespace {

// Rank 0 accepts on the id's socket, rank 1 connects to it; polls `aborted` meanwhile.
int Join(ncclComm* c, const std::string& name) {
  int fd = -1;
  if (c->rank == 0) {
    int listener = -1;
    {
      std::lock_guard<std::mutex> lock(g_ids_mu);
      auto it = Ids().find(name);
      if (it == Ids().end()) return kInvalidUsage;  // rank 0 must be the id's process
      listener = it->second;
      Ids().erase(it);
    }
    for (;;) {
      if (c->aborted) {
        ::close(listener);
        return kSystemError;
      }
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) break;
    }
    fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(listener);
  } else {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    const sockaddr_un a = Address(name, &len);
    while (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) {
      if (c->aborted || (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN)) {
        ::close(fd);
        return kSystemError;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (fd < 0) return kSystemError;
  c->fd = fd;
  return kSuccess;
}

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

// Moves `bytes` between the device buffer and the peer, a piece at a time through host memory.
int Move(char* device, size_t bytes, ncclComm* c, cudaStream_t stream, bool send) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return kUnhandledCudaError;
  // Each message carries its size, so that a receive of another size fails as it does with
  // NCCL (whose sends and receives must match) instead of splitting the byte stream.
  uint64_t size = bytes;
  if (!IoAll(c->fd, reinterpret_cast<char*>(&size), sizeof(size), send)) return kRemoteError;
  if (size != bytes) return kInvalidUsage;
  std::vector<char> host(bytes < kPiece ? bytes : kPiece);
  for (size_t at = 0; at < bytes; at += host.size()) {
    const size_t n = bytes - at < host.size() ? bytes - at : host.size();
    if (send && cudaMemcpy(host.data(), device + at, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return kUnhandledCudaError;
    }
    if (!IoAll(c->fd, host.data(), n, send)) return kRemoteError;  // peer gone, or aborted
    if (!send && cudaMemcpy(device + at, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) {
      return kUnhandledCudaError;
    }
  }
  return kSuccess;
}

// Arguments are checked at the call, as NCCL does; a nonblocking comm then moves the bytes on
// a thread of its own and answers kInProgress until they have moved (ncclCommGetAsyncError;
// an error stays, as NCCL's async errors do). An abort from another thread makes the socket
// fail, so the move returns.
int Transfer(char* device, size_t bytes, int datatype, int peer, ncclComm* c, cudaStream_t stream,
             bool send) {
  if (c == nullptr || datatype != 1 || peer != 1 - c->rank) return kInvalidArgument;
  if (const int state = c->state; state != kSuccess) {
    return state == kInProgress ? kInvalidUsage : state;
  }
  if (bytes > 0 && (device == nullptr || !OnDevice(device))) return kInvalidArgument;
  if (c->blocking) {
    const int result = Move(device, bytes, c, stream, send);
    if (result != kSuccess) c->state = result;
    return result;
  }
  if (c->op.joinable()) c->op.join();  // finished: the state was not kInProgress
  c->state = kInProgress;
  c->op = std::thread([=] { c->state = Move(device, bytes, c, stream, send); });
  return kInProgress;
}

int End(ncclComm* c) {
  if (c == nullptr) return kInvalidArgument;
  c->aborted = true;
  if (const int fd = c->fd.load(); fd >= 0) ::shutdown(fd, SHUT_RDWR);
  if (c->op.joinable()) c->op.join();
  if (c->join.joinable()) c->join.join();
  if (const int fd = c->fd.load(); fd >= 0) ::close(fd);
  delete c;
  return kSuccess;
}

}  // namespace

#define KVC_EXPORT __attribute__((visibility("default")))

// The names are NCCL's: the ABI this library stands in for.
// NOLINTBEGIN(readability-identifier-naming)
extern "C" {

KVC_EXPORT int ncclGetVersion(int* version) {
  if (version == nullptr) return kInvalidArgument;
  *version = 21400;  // what it implements of NCCL's API
  return kSuccess;
}

KVC_EXPORT int ncclGetUniqueId(UniqueId* id) {
  if (id == nullptr) return kInvalidArgument;
  std::random_device rd;
  char name[64];
  std::snprintf(name, sizeof(name), "kvc-nccl-loopback-%d-%08x%08x", static_cast<int>(getpid()),
                rd(), rd());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = 0;
  const sockaddr_un a = Address(name, &len);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      ::listen(fd, 1) != 0) {
    if (fd >= 0) ::close(fd);
    return kSystemError;
  }
  {
    std::lock_guard<std::mutex> lock(g_ids_mu);
    Ids()[name] = fd;
  }
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, kMagic, sizeof(kMagic));
  std::memcpy(id->internal + sizeof(kMagic), name, std::strlen(name));
  return kSuccess;
}

KVC_EXPORT int ncclCommInitRankConfig(ncclComm** comm, int nranks, UniqueId id, int rank,
                                      Config* config) {
  if (comm == nullptr || nranks != 2 || (rank != 0 && rank != 1) ||
      std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0 ||
      (config != nullptr && config->magic != 0xcafebeef)) {
    return kInvalidArgument;
  }
  const std::string name(id.internal + sizeof(kMagic),
                         strnlen(id.internal + sizeof(kMagic), sizeof(id.internal) - 8));
  auto* c = new ncclComm();
  c->rank = rank;
  c->blocking = config == nullptr || config->blocking != 0;
  *comm = c;
  if (!c->blocking) {
    c->join = std::thread([c, name] { c->state = Join(c, name); });
    return kInProgress;
  }
  c->state = Join(c, name);
  return c->state;
}

KVC_EXPORT int ncclCommGetAsyncError(ncclComm* comm, int* error) {
  if (comm == nullptr || error == nullptr) return kInvalidArgument;
  *error = comm->state;
  return kSuccess;
}

KVC_EXPORT int ncclCommAbort(ncclComm* comm) { return End(comm); }
KVC_EXPORT int ncclCommDestroy(ncclComm* comm) { return End(comm); }

KVC_EXPORT int ncclSend(const void* buffer, size_t count, int datatype, int peer, ncclComm* comm,
                        cudaStream_t stream) {
  return Transfer(static_cast<char*>(const_cast<void*>(buffer)), count, datatype, peer, comm,
                  stream, /*send=*/true);
}

KVC_EXPORT int ncclRecv(void* buffer, size_t count, int datatype, int peer, ncclComm* comm,
                        cudaStream_t stream) {
  return Transfer(static_cast<char*>(buffer), count, datatype, peer, comm, stream, /*send=*/false);
}

KVC_EXPORT const char* ncclGetErrorString(int result) {
  switch (result) {
    case kSuccess:
      return "no error";
    case kUnhandledCudaError:
      return "unhandled cuda error (loopback)";
    case kSystemError:
      return "unhandled system error (loopback: a socket failed or the join was aborted)";
    case kInvalidArgument:
      return "invalid argument (loopback: ranks 0/1, ncclUint8, device buffers only)";
    case kInvalidUsage:
      return "invalid usage (loopback: not joined yet, or rank 0 outside the id's process)";
    case kRemoteError:
      return "remote process exited or there was a network error (loopback)";
    case kInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

}  // extern "C"
// NOLINTEND(readability-identifier-naming)
