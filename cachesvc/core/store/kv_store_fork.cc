// KvStore::ForkSequence (sequence_fork.h).
#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/ops/sequence_fork.h"
#include "cachesvc/core/store/kv_store.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

absl::StatusOr<SequenceSnapshot> KvStore::ForkSequence(const ForkSequenceParams& p) {
  if (parts_->draining.load()) {
    return absl::UnavailableError(
        "kvcached is draining (shutting down) and takes no new sequences; fork on another "
        "instance");
  }
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> source, parts_->FindLive(p.scope, p.sequence_id));
  KVC_RETURN_IF_ERROR(CheckClientId(p.client_sequence_id));
  std::shared_ptr<TenantAccount> account = parts_->accounts.Get(source->tenant());
  KVC_RETURN_IF_ERROR(account->AddSequence());
  auto child = std::make_shared<Sequence>(
      SequenceIdFor(p.client_sequence_id), source->scope(), source->tenant(), source->pool(),
      source->pool_index(), source->usage(), std::move(account), source->policy(), NowUnixMs());
  {
    // Before the fork is registered: nobody else can see it half-copied.
    kvc::ReaderMutexLock source_lock(&source->mu());
    // An append's write in flight would land in blocks the fork is about to share.
    source->AwaitNoWrites();
    kvc::WriterMutexLock child_lock(&child->mu());
    absl::Status forked =
        source->released()
            ? absl::NotFoundError(absl::StrCat("sequence ", Quoted(p.sequence_id), " was released"))
            : ForkLocked(*source, *child);
    if (!forked.ok()) {
      child->account()->RemoveSequence();
      return forked;
    }
  }
  return Register(child);
}

}  // namespace kvc::cachesvc
