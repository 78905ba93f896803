#include "transfer/nccl_api.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"

namespace kvc::nccl {
namespace {

struct Loaded {
  std::unique_ptr<Api> api;  // stable address: callers keep the pointer
  absl::Status status;
};

struct Registry {
  kvc::Mutex mu;
  std::map<std::string, Loaded> libraries ABSL_GUARDED_BY(mu);
};
Registry& TheRegistry() {
  static auto* registry = new Registry();  // never destroyed: callers keep Api pointers
  return *registry;
}

std::string DlError() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

template <typename Fn>
bool Bind(void* handle, const char* name, Fn* fn, std::string* missing) {
  void* symbol = ::dlsym(handle, name);
  if (symbol == nullptr) {
    if (missing->empty()) *missing = name;
    return false;
  }
  *fn = reinterpret_cast<Fn>(symbol);
  return true;
}

Loaded Open(const std::string& library) {
  Loaded out;
  const auto refuse = [&](const std::string& why) {
    out.status = absl::FailedPreconditionError(
        absl::StrCat("NCCL could not be loaded from ", library, ": ", why,
                     " (NCCL transfers need NCCL >= 2.14 on this machine; TCP transfers and "
                     "same-node reads do not)"));
    return std::move(out);
  };
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return refuse(DlError());
  auto api = std::make_unique<Api>();
  api->library = library;
  Result (*get_version)(int*) = nullptr;
  std::string missing;
  bool ok = Bind(handle, "ncclGetVersion", &get_version, &missing);
  ok &= Bind(handle, "ncclGetUniqueId", &api->get_unique_id, &missing);
  ok &= Bind(handle, "ncclCommInitRankConfig", &api->comm_init_rank_config, &missing);
  ok &= Bind(handle, "ncclCommDestroy", &api->comm_destroy, &missing);
  ok &= Bind(handle, "ncclCommAbort", &api->comm_abort, &missing);
  ok &= Bind(handle, "ncclCommGetAsyncError", &api->comm_get_async_error, &missing);
  ok &= Bind(handle, "ncclSend", &api->send, &missing);
  ok &= Bind(handle, "ncclRecv", &api->recv, &missing);
  ok &= Bind(handle, "ncclGetErrorString", &api->get_error_string, &missing);
  // Not dlclose'd on failure either: unloading a half-inspected library buys nothing.
  if (!ok) return refuse(absl::StrCat("it has no ", missing, " (not NCCL, or too old)"));
  if (get_version(&api->version) != kSuccess) return refuse("ncclGetVersion failed");
  if (api->version < kMinVersion) {
    return refuse(absl::StrCat("its version is ", api->version, ", older than 2.14"));
  }
  out.api = std::move(api);
  return out;
}

}  // namespace

absl::Status Api::Check(Result result, const char* what) const {
  if (result == kSuccess) return absl::OkStatus();
  const char* words = get_error_string != nullptr ? get_error_string(result) : nullptr;
  return absl::UnavailableError(
      absl::StrCat(what, ": ", words != nullptr ? words : "failed", " (NCCL error ", result, ")"));
}

std::string Api::Describe() const {
  // NCCL_VERSION: major * 1000 + minor * 100 + patch up to 2.8, major * 10000 + ... since.
  const bool wide = version >= 10000;
  return absl::StrCat("NCCL ", version / (wide ? 10000 : 1000), ".",
                      version / 100 % (wide ? 100 : 10), ".", version % 100, " (", library, ")");
}

Result GuardedComm::Join(const UniqueId& id, int rank) {
  kvc::MutexLock lock(&mu_);
  Config config;  // nonblocking: a join the other side never completes can be given up on
  const Result r = api_->comm_init_rank_config(&comm_, 2, id, rank, &config);
  if (r != kSuccess && r != kInProgress) {
    if (comm_ != nullptr) (void)api_->comm_abort(comm_);
    comm_ = nullptr;
  }
  peer_ = 1 - rank;
  return r;
}

Result GuardedComm::State() {
  kvc::MutexLock lock(&mu_);
  if (comm_ == nullptr) return -1;
  Result state = kInProgress;
  const Result r = api_->comm_get_async_error(comm_, &state);
  return r == kSuccess ? state : r;
}

Result GuardedComm::Send(const void* buffer, size_t bytes, void* stream) {
  kvc::MutexLock lock(&mu_);
  return comm_ == nullptr ? -1 : api_->send(buffer, bytes, kUint8, peer_, comm_, stream);
}

Result GuardedComm::Recv(void* buffer, size_t bytes, void* stream) {
  kvc::MutexLock lock(&mu_);
  return comm_ == nullptr ? -1 : api_->recv(buffer, bytes, kUint8, peer_, comm_, stream);
}

void GuardedComm::Abort() {
  kvc::MutexLock lock(&mu_);
  if (comm_ != nullptr) (void)api_->comm_abort(comm_);
  comm_ = nullptr;
}

absl::StatusOr<const Api*> Load(const std::string& library) {
  Registry& r = TheRegistry();
  kvc::MutexLock lock(&r.mu);
  auto it = r.libraries.find(library);
  if (it == r.libraries.end()) it = r.libraries.emplace(library, Open(library)).first;
  if (it->second.api == nullptr) return it->second.status;
  return it->second.api.get();
}

}  // namespace kvc::nccl
