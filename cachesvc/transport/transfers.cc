#include "cachesvc/transport/transfers.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"

namespace kvc::cachesvc {

void Transfers::Offer(int kind, std::string id_prefix, TransferChannels* channels) {
  kinds_.push_back(Kind{kind, std::move(id_prefix), channels, ""});
}

void Transfers::Refuse(int kind, std::string why) {
  kinds_.push_back(Kind{kind, "", nullptr, std::move(why)});
}

const Transfers::Kind* Transfers::Find(int kind) const {
  for (const Kind& k : kinds_) {
    if (k.kind == kind) return &k;
  }
  return nullptr;
}

absl::StatusOr<OpenedTransfer> Transfers::Open(int kind, const TenantScope& scope,
                                               const std::string& pool) const {
  if (kind == 0) kind = kTcp;
  if (kind != kTcp && kind != kNccl) {
    return absl::InvalidArgumentError(
        absl::StrCat("OpenTransfer kind ", kind, " is not TCP (1) or NCCL (2)"));
  }
  const Kind* k = Find(kind);
  if (k == nullptr || k->channels == nullptr) {
    return absl::FailedPreconditionError(k == nullptr ? "this server offers no such transfers"
                                                      : k->why);
  }
  return k->channels->Open(scope, pool);
}

absl::StatusOr<TransferChannels*> Transfers::ForId(const std::string& id) const {
  bool any = false;
  for (const Kind& k : kinds_) {
    if (k.channels == nullptr) continue;
    any = true;
    if (absl::StartsWith(id, k.id_prefix)) return k.channels;
  }
  if (!any) {
    const Kind* tcp = Find(kTcp);
    return absl::FailedPreconditionError(tcp != nullptr ? tcp->why
                                                        : "this server offers no transfers");
  }
  return absl::NotFoundError(
      absl::StrCat("transfer ", Quoted(id), " does not exist (never opened, closed, or broken)"));
}

absl::StatusOr<SentBlocks> Transfers::Send(const TenantScope& scope, const std::string& id,
                                           const std::string& lease_id, uint64_t nonce,
                                           absl::Time deadline) const {
  absl::StatusOr<TransferChannels*> channels = ForId(id);
  if (!channels.ok()) return channels.status();
  return (*channels)->Send(scope, id, lease_id, nonce, deadline);
}

absl::Status Transfers::Close(const TenantScope& scope, const std::string& id) const {
  absl::StatusOr<TransferChannels*> channels = ForId(id);
  if (!channels.ok()) return channels.status();
  return (*channels)->Close(scope, id);
}

}  // namespace kvc::cachesvc
