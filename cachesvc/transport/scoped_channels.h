// ScopedChannels: the open transfers of one kind (TCP: tcp_channels.h, NCCL:
// nccl_channels.h) by id, each belonging to the scope (tenant) that opened it: ids of 128
// random bits (common/random_id.h), at most kMaxPerScope per scope, and the lookups that keep one
// scope from reaching another's transfers. `Channel` has a `scope` member.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "common/mutex.h"
#include "common/random_id.h"

namespace kvc::cachesvc {

template <typename Channel>
class ScopedChannels {
 public:
  static constexpr int kMaxPerScope = 16;

  // `prefix` starts every id ("t-", "n-"), so that a transfer id says its kind.
  explicit ScopedChannels(std::string prefix) : prefix_(std::move(prefix)) {}

  // First drops the scope's channels `done` says are finished with (a join or connection
  // that never came, a broken channel; `done` must not block), then adds `channel` under a
  // new id. RESOURCE_EXHAUSTED when the scope still has kMaxPerScope. Returns the id.
  absl::StatusOr<std::string> Add(std::shared_ptr<Channel> channel,
                                  const std::function<bool(Channel&)>& done) {
    std::vector<std::shared_ptr<Channel>> dropped;  // ended after the lock is released
    kvc::MutexLock lock(&mu_);
    int open = 0;
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (it->second->scope == channel->scope && done(*it->second)) {
        dropped.push_back(std::move(it->second));
        it = channels_.erase(it);
        continue;
      }
      open += it->second->scope == channel->scope ? 1 : 0;
      ++it;
    }
    if (open >= kMaxPerScope) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this client has ", open, " transfers open (the most): close those it does not use"));
    }
    std::string id = RandomId(prefix_);
    channels_.emplace(id, std::move(channel));
    return id;
  }

  // The scope's channel `id`; null when there is none (another scope's is none too).
  std::shared_ptr<Channel> Find(const TenantScope& scope, const std::string& id) const {
    kvc::MutexLock lock(&mu_);
    auto it = channels_.find(id);
    if (it == channels_.end() || it->second->scope != scope) return nullptr;
    return it->second;
  }
  // Any scope's: for a connection that proves itself another way (TCP: its token).
  std::shared_ptr<Channel> FindById(const std::string& id) const {
    kvc::MutexLock lock(&mu_);
    auto it = channels_.find(id);
    return it == channels_.end() ? nullptr : it->second;
  }

  // Removes the scope's channel `id`; it ends when the last send holding it is done.
  absl::Status Close(const TenantScope& scope, const std::string& id) {
    std::shared_ptr<Channel> gone;
    kvc::MutexLock lock(&mu_);
    auto it = channels_.find(id);
    if (it == channels_.end() || it->second->scope != scope) return Unknown(id);
    gone = std::move(it->second);
    channels_.erase(it);
    return absl::OkStatus();
  }

  std::vector<std::shared_ptr<Channel>> All() const {
    kvc::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<Channel>> all;
    for (const auto& [id, c] : channels_) all.push_back(c);
    return all;
  }
  void Clear() {
    kvc::MutexLock lock(&mu_);
    channels_.clear();
  }

  static absl::Status Unknown(const std::string& id) {
    return absl::NotFoundError(
        absl::StrCat("transfer ", Quoted(id), " does not exist (never opened, closed, or broken)"));
  }

 private:
  const std::string prefix_;
  mutable kvc::Mutex mu_;
  std::map<std::string, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvc::cachesvc
