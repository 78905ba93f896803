// Transfers: the kinds of transfer channel a server offers (transfer_channels.h), found by
// kind for OpenTransfer and by the id's prefix for SendLease and CloseTransfer (each kind
// makes ids with its own prefix: scoped_channels.h). A kind not offered answers
// FAILED_PRECONDITION with the reason the server gave (the config that would enable it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/transport/transfer_channels.h"

namespace kvc::cachesvc {

class Transfers {
 public:
  // kvcache.v1.TransferKind numbers (0, UNSPECIFIED, is TCP).
  static constexpr int kTcp = 1;
  static constexpr int kNccl = 2;

  // `channels` (outliving this) serve `kind`, whose ids start with `id_prefix`.
  void Offer(int kind, std::string id_prefix, TransferChannels* channels);
  // `kind` is not offered: its calls are FAILED_PRECONDITION saying `why`.
  void Refuse(int kind, std::string why);

  // INVALID_ARGUMENT for a kind that is none of the above.
  absl::StatusOr<OpenedTransfer> Open(int kind, const TenantScope& scope,
                                      const std::string& pool) const;
  absl::StatusOr<SentBlocks> Send(const TenantScope& scope, const std::string& id,
                                  const std::string& lease_id, uint64_t nonce,
                                  absl::Time deadline) const;
  absl::Status Close(const TenantScope& scope, const std::string& id) const;

 private:
  struct Kind {
    int kind = 0;
    std::string id_prefix;                 // offered: non-empty
    TransferChannels* channels = nullptr;  // null: refused
    std::string why;                       // refused: the reason
  };
  const Kind* Find(int kind) const;
  // The offered kind whose ids `id` starts like; else NOT_FOUND, or the TCP kind's refusal
  // when no kind is offered at all (nothing could have made the id).
  absl::StatusOr<TransferChannels*> ForId(const std::string& id) const;

  std::vector<Kind> kinds_;
};

}  // namespace kvc::cachesvc
