#include "cachesvc/core/sequence_registry.h"

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace kvc::cachesvc {

SequenceRegistry::Shard& SequenceRegistry::shard(const std::string& id) const {
  return shards_[absl::Hash<std::string>{}(id) % kShards];
}

absl::Status SequenceRegistry::Insert(std::shared_ptr<Sequence> sequence) {
  Shard& s = shard(sequence->id());
  kvc::MutexLock lock(&s.mu);
  auto [it, inserted] = s.map.emplace(sequence->id(), sequence);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("sequence '", sequence->id(),
                                                 "' already exists; choose another "
                                                 "client_sequence_id or Release the old one"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Sequence>> SequenceRegistry::Find(const std::string& id) const {
  Shard& s = shard(id);
  kvc::MutexLock lock(&s.mu);
  auto it = s.map.find(id);
  if (it == s.map.end()) {
    return absl::NotFoundError(
        absl::StrCat("sequence '", id, "' not found: it was released or never created"));
  }
  return it->second;
}

bool SequenceRegistry::Erase(const std::string& id) {
  Shard& s = shard(id);
  kvc::MutexLock lock(&s.mu);
  return s.map.erase(id) > 0;
}

int64_t SequenceRegistry::size() const {
  int64_t n = 0;
  for (auto& s : shards_) {
    kvc::MutexLock lock(&s.mu);
    n += static_cast<int64_t>(s.map.size());
  }
  return n;
}

std::vector<std::shared_ptr<Sequence>> SequenceRegistry::All() const {
  std::vector<std::shared_ptr<Sequence>> all;
  for (auto& s : shards_) {
    kvc::MutexLock lock(&s.mu);
    for (const auto& [id, seq] : s.map) all.push_back(seq);
  }
  return all;
}

}  // namespace kvc::cachesvc
