#include "cachesvc/core/sequence/sequence_registry.h"

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"

namespace kvc::cachesvc {

SequenceRegistry::Shard& SequenceRegistry::shard(const Key& key) const {
  return shards_[absl::Hash<Key>{}(key) % kShards];
}

absl::Status SequenceRegistry::Insert(const std::shared_ptr<Sequence>& sequence, int64_t max_size) {
  Key key(sequence->scope(), sequence->id());
  Shard& s = shard(key);
  kvc::MutexLock lock(&s.mu);
  if (s.map.contains(key)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", Quoted(sequence->id()),
                                                 " already exists; choose another "
                                                 "client_sequence_id or Release the old one"));
  }
  // Reserve a place atomically, so concurrent creates cannot together pass the limit.
  if (size_.fetch_add(1, std::memory_order_relaxed) >= max_size) {
    size_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat("the server holds its maximum of ", max_size,
                                                     " sequences; release some first"));
  }
  s.map.emplace(std::move(key), sequence);
  order_.Add(sequence);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Sequence>> SequenceRegistry::Find(const TenantScope& scope,
                                                                 const std::string& id) const {
  const Key key(scope, id);
  Shard& s = shard(key);
  kvc::MutexLock lock(&s.mu);
  auto it = s.map.find(key);
  if (it == s.map.end()) {
    return absl::NotFoundError(
        absl::StrCat("sequence ", Quoted(id), " not found: it was released or never created"));
  }
  return it->second;
}

bool SequenceRegistry::Erase(const TenantScope& scope, const std::string& id) {
  const Key key(scope, id);
  Shard& s = shard(key);
  kvc::MutexLock lock(&s.mu);
  auto it = s.map.find(key);
  if (it == s.map.end()) return false;
  order_.Remove(*it->second);
  s.map.erase(it);
  size_.fetch_sub(1, std::memory_order_relaxed);
  return true;
}

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::All() const {
  std::vector<std::shared_ptr<Sequence>> all;
  for (auto& s : shards_) {
    kvc::MutexLock lock(&s.mu);
    for (const auto& [key, seq] : s.map) all.push_back(seq);
  }
  return all;
}

}  // namespace kvc::cachesvc
