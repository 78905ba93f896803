#include "cachesvc/core/sequence/sequence_order.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/sequence/sequence.h"

namespace kvc::cachesvc {
namespace {

// A field of a group's name, length-prefixed: no tenant label can make two groups one.
std::string Field(const std::string& s) { return absl::StrCat(s.size(), ":", s); }

std::string ScopeGroup(const TenantScope& scope) { return "s" + Field(scope.tenant()); }
std::string TenantGroup(const std::string& tenant) { return "t" + Field(tenant); }
std::string PoolGroup(int pool) { return absl::StrCat("p", pool); }
std::string ScopePoolGroup(const TenantScope& scope, int pool) {
  return absl::StrCat("sp", pool, "/", Field(scope.tenant()));
}
std::string TenantPoolGroup(const std::string& tenant, int pool) {
  return absl::StrCat("tp", pool, "/", Field(tenant));
}

bool Matches(const Sequence& s, const SequenceOrder::Query& q) {
  return (q.scope == nullptr || s.scope() == *q.scope) &&
         (q.tenant == nullptr || s.tenant() == *q.tenant) &&
         (q.pool < 0 || s.pool_index() == q.pool);
}

}  // namespace

std::vector<std::string> SequenceOrder::GroupsOf(const Sequence& s) {
  return {"a",
          ScopeGroup(s.scope()),
          TenantGroup(s.tenant()),
          PoolGroup(s.pool_index()),
          ScopePoolGroup(s.scope(), s.pool_index()),
          TenantPoolGroup(s.tenant(), s.pool_index())};
}

void SequenceOrder::Add(const std::shared_ptr<Sequence>& sequence) {
  kvc::MutexLock lock(&mu_);
  const Key key(sequence->created_unix_ms(), sequence->scope().tenant(),
                next_ordinal_[sequence->scope()]++);
  keys_.emplace(sequence.get(), key);
  for (const std::string& group : GroupsOf(*sequence)) groups_[group].emplace(key, sequence);
}

void SequenceOrder::Remove(const Sequence& sequence) {
  kvc::MutexLock lock(&mu_);
  auto at = keys_.find(&sequence);
  if (at == keys_.end()) return;
  const Key key = at->second;
  keys_.erase(at);
  for (const std::string& group : GroupsOf(sequence)) {
    auto it = groups_.find(group);
    if (it == groups_.end()) continue;
    it->second.erase(key);
    if (it->second.empty()) groups_.erase(it);  // tenant labels come and go
  }
}

const SequenceOrder::Ordered* SequenceOrder::Narrowest(const Query& q, bool* exact) const {
  std::string group = "a";
  *exact = true;
  if (q.tenant != nullptr) {
    group = q.pool >= 0 ? TenantPoolGroup(*q.tenant, q.pool) : TenantGroup(*q.tenant);
    *exact = q.scope == nullptr;
  } else if (q.scope != nullptr) {
    group = q.pool >= 0 ? ScopePoolGroup(*q.scope, q.pool) : ScopeGroup(*q.scope);
  } else if (q.pool >= 0) {
    group = PoolGroup(q.pool);
  }
  auto it = groups_.find(group);
  return it == groups_.end() ? nullptr : &it->second;
}

SequenceOrder::Page SequenceOrder::List(const Query& q) const {
  Page page;
  kvc::ReaderMutexLock lock(&mu_);
  bool exact = true;
  const Ordered* ordered = Narrowest(q, &exact);
  if (ordered == nullptr) return page;
  auto it = q.after == nullptr ? ordered->begin() : ordered->upper_bound(*q.after);
  for (; it != ordered->end(); ++it) {
    if (!exact && !Matches(*it->second, q)) continue;
    if (static_cast<int64_t>(page.sequences.size()) == q.limit) {
      page.more = true;
      break;
    }
    page.sequences.push_back(it->second);
    page.last = it->first;
  }
  if (exact) {
    page.total = static_cast<int64_t>(ordered->size());
  } else {
    for (const auto& [key, seq] : *ordered) page.total += Matches(*seq, q) ? 1 : 0;
  }
  return page;
}

int64_t SequenceOrder::Count(const Query& q) const {
  kvc::ReaderMutexLock lock(&mu_);
  bool exact = true;
  const Ordered* ordered = Narrowest(q, &exact);
  if (ordered == nullptr) return 0;
  if (exact) return static_cast<int64_t>(ordered->size());
  int64_t n = 0;
  for (const auto& [key, seq] : *ordered) n += Matches(*seq, q) ? 1 : 0;
  return n;
}

std::string SequenceOrder::Token(const Key& key) {
  const auto& [created, scope, ordinal] = key;
  return absl::WebSafeBase64Escape(absl::StrCat(created, ":", ordinal, ":", scope));
}

absl::StatusOr<SequenceOrder::Key> SequenceOrder::ParseToken(const std::string& token) {
  std::string raw;
  int64_t created = 0;
  uint64_t ordinal = 0;
  if (token.size() <= 1024 && absl::WebSafeBase64Unescape(token, &raw)) {
    const size_t a = raw.find(':');
    const size_t b = a == std::string::npos ? a : raw.find(':', a + 1);
    if (b != std::string::npos && absl::SimpleAtoi(raw.substr(0, a), &created) &&
        absl::SimpleAtoi(raw.substr(a + 1, b - a - 1), &ordinal)) {
      return Key{created, raw.substr(b + 1), ordinal};
    }
  }
  return absl::InvalidArgumentError(
      "page_token is not one this server gave (pass next_page_token unchanged)");
}

}  // namespace kvc::cachesvc
