// The NCCL entry points of NCCL transfer channels (issue #13 item 4: a device pool's leased
// blocks sent with ncclSend to a reader on another GPU), loaded at run time with dlopen so
// that kvcached and the client library build and run where NCCL is missing: there, asking
// for an NCCL channel is a clear error naming the library and why it could not be loaded.
//
// The few ABI types are declared here (NCCL's C ABI: a 128-byte unique id passed by value,
// an opaque communicator pointer, int results and data types, cudaStream_t as a pointer), so
// nothing includes nccl.h. Shared by kvcached and the client library: Abseil and libdl only.
#pragma once

#include <cstddef>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace kvc::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};
using Comm = struct ncclComm*;
using Result = int;  // ncclResult_t
inline constexpr Result kSuccess = 0;
inline constexpr Result kInProgress = 7;
inline constexpr int kUint8 = 1;  // ncclUint8: payloads are bytes
// The oldest NCCL with nonblocking communicators (ncclConfig_t.blocking), which is how a
// join that never completes can be given up on (ncclCommAbort): 2.14.
inline constexpr int kMinVersion = 21400;

// ncclConfig_t as NCCL 2.14 declared it. NCCL reads `size` bytes of a caller's config and
// gives every field a later `version` added its default, so this prefix is what any NCCL
// since 2.14 expects from a 2.14 caller.
struct Config {
  size_t size = sizeof(Config);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21400;
  int blocking = 0;  // 0: calls may return kInProgress; poll comm_get_async_error
  int cga_cluster_size = kUndefined;
  int min_ctas = kUndefined;
  int max_ctas = kUndefined;
  const char* net_name = nullptr;
  static constexpr int kUndefined = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT
};
static_assert(sizeof(Config) == 40, "ncclConfig_t v2.14 is 40 bytes on LP64 machines");

struct Api {
  std::string library;  // as given to Load
  int version = 0;      // ncclGetVersion's number (2.28.9: 22809)

  Result (*get_unique_id)(UniqueId* id) = nullptr;
  Result (*comm_init_rank_config)(Comm* comm, int nranks, UniqueId id, int rank,
                                  Config* config) = nullptr;
  Result (*comm_destroy)(Comm comm) = nullptr;
  Result (*comm_abort)(Comm comm) = nullptr;
  Result (*comm_get_async_error)(Comm comm, Result* async_error) = nullptr;
  Result (*send)(const void* buffer, size_t count, int datatype, int peer, Comm comm,
                 void* stream) = nullptr;
  Result (*recv)(void* buffer, size_t count, int datatype, int peer, Comm comm,
                 void* stream) = nullptr;
  const char* (*get_error_string)(Result result) = nullptr;

  // OK for kSuccess; otherwise UNAVAILABLE "<what>: <NCCL's words> (NCCL error N)".
  absl::Status Check(Result result, const char* what) const;
  // "NCCL 2.28.9 (libnccl.so.2)", for logs and connection info.
  std::string Describe() const;
};

// Loads `library` (a file name searched as dlopen does, or a path) and every entry point
// above, once per process and name: later calls return the same Api, and a failure is
// reported again without retrying. FAILED_PRECONDITION naming the library and the reason
// (dlopen's message, the missing symbol, a version older than 2.14). The library is never
// unloaded (NCCL keeps threads of its own).
absl::StatusOr<const Api*> Load(const std::string& library = "libnccl.so.2");

// One side of a two-rank communicator, used by one thread and aborted by another (a
// watchdog, a close): the lock orders the two, and an aborted communicator (which NCCL
// frees) is never used again. Every call here returns at once (nonblocking communicators);
// callers wait outside it. Thread-safe.
class GuardedComm {
 public:
  explicit GuardedComm(const Api* api) : api_(api) {}
  GuardedComm(const GuardedComm&) = delete;
  GuardedComm& operator=(const GuardedComm&) = delete;
  ~GuardedComm() { Abort(); }

  // Starts joining as `rank` (0 or 1) of 2, nonblocking: kSuccess or kInProgress; any other
  // result aborts what was started and is returned.
  Result Join(const UniqueId& id, int rank);
  // kInProgress, kSuccess or the communicator's error; -1 once aborted (or never joined).
  Result State();
  // To or from the other rank, on `stream` (a cudaStream_t); -1 once aborted.
  Result Send(const void* buffer, size_t bytes, void* stream);
  Result Recv(void* buffer, size_t bytes, void* stream);
  void Abort();

 private:
  const Api* const api_;
  kvc::Mutex mu_;
  Comm comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  int peer_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvc::nccl
