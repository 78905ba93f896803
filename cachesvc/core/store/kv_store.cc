#include "cachesvc/core/store/kv_store.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/ops/append.h"
#include "cachesvc/core/ops/attend.h"
#include "cachesvc/core/ops/compress.h"
#include "cachesvc/core/ops/fetch.h"
#include "cachesvc/core/pool/pool_options.h"
#include "cachesvc/core/prefix/prefix_attach.h"
#include "cachesvc/core/sequence/snapshot.h"
#include "common/check.h"
#include "common/random_id.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {
namespace {

absl::Status Released(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("sequence ", Quoted(id), " was released"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const KvStoreOptions& options) {
  KVC_ASSIGN_OR_RETURN(std::unique_ptr<StoreParts> parts, StoreParts::Create(options));
  return std::unique_ptr<KvStore>(new KvStore(std::move(parts)));
}

KvStore::~KvStore() = default;

absl::StatusOr<SequenceSnapshot> KvStore::CreateSequence(const CreateSequenceParams& params) {
  if (parts_->draining.load()) {
    return absl::UnavailableError(
        "kvcached is draining (shutting down) and takes no new sequences; create it on "
        "another instance");
  }
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, parts_->FindPool(params.pool));
  if (!pool->options().tenant.empty() && params.scope.tenant() != pool->options().tenant) {
    return absl::PermissionDeniedError(absl::StrCat("pool ", Quoted(pool->options().name),
                                                    " holds one other tenant's sequences only"));
  }
  if (params.tenant.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant is ", params.tenant.size(), " bytes; at most 128 are allowed"));
  }
  KVC_RETURN_IF_ERROR(CheckClientId(params.client_sequence_id));
  KVC_RETURN_IF_ERROR(ValidateSpec(params.policy, pool->options().geometry, /*automatic=*/true));
  if (params.prefix) KVC_RETURN_IF_ERROR(ValidatePrefix(*params.prefix, params.policy));
  std::string id = SequenceIdFor(params.client_sequence_id);
  const int pool_index = parts_->PoolIndex(pool);
  PoolUsage* usage = parts_->usage[static_cast<size_t>(pool_index)].get();
  std::shared_ptr<TenantAccount> account = parts_->accounts.Get(params.tenant);
  KVC_RETURN_IF_ERROR(account->AddSequence());
  auto sequence =
      std::make_shared<Sequence>(std::move(id), params.scope, params.tenant, pool, pool_index,
                                 usage, std::move(account), params.policy, NowUnixMs());
  if (params.prefix) {
    // Before the sequence is registered: nobody else can see it half-attached.
    if (absl::Status attached = prefixes_.Attach(*sequence, pool_index, *params.prefix);
        !attached.ok()) {
      sequence->account()->RemoveSequence();
      return attached;
    }
  }
  return Register(sequence);
}

absl::StatusOr<SequenceSnapshot> KvStore::Register(const std::shared_ptr<Sequence>& sequence) {
  if (absl::Status inserted = parts_->registry.Insert(sequence, parts_->options.max_sequences);
      !inserted.ok()) {
    kvc::WriterMutexLock lock(&sequence->mu());
    DropAttachedLocked(*sequence);
    sequence->account()->RemoveSequence();
    return inserted;
  }
  sequence->usage()->sequences.fetch_add(1, std::memory_order_relaxed);
  kvc::ReaderMutexLock lock(&sequence->mu());
  return SnapshotLocked(*sequence);
}

absl::Status KvStore::CheckClientId(const std::string& client_sequence_id) const {
  if (!client_sequence_id.empty() && !IsValidName(client_sequence_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_sequence_id ", Quoted(client_sequence_id),
                     " is invalid: use 1-128 characters from [A-Za-z0-9._:-]"));
  }
  return parts_->shard.CheckClientId(client_sequence_id);
}

std::string KvStore::SequenceIdFor(const std::string& client_sequence_id) {
  return parts_->shard.Qualify(client_sequence_id.empty() ? RandomId("s-") : client_sequence_id);
}

absl::StatusOr<AppendResult> KvStore::Append(const AppendParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(p.scope, p.sequence_id));
  // Everything about the request itself is checked before any lock or allocation.
  KVC_ASSIGN_OR_RETURN(const DType dtype, ValidateAppend(p, seq->pool()->options(),
                                                         parts_->options.max_tokens_per_append));
  // Two phases where the plan allows (append.h): planned under the lock, the rows written
  // with it released (other layers' appends of the sequence, and its readers, go on
  // meanwhile), published under it again.
  PreparedAppend prepared;
  {
    kvc::WriterMutexLock lock(&seq->mu());
    seq->AwaitLayerIdle(static_cast<int>(p.layer));  // (which may release the lock a while)
    if (seq->released()) return Released(p.sequence_id);
    KVC_ASSIGN_OR_RETURN(prepared, PrepareAppend(*seq, p, dtype));
    if (!prepared.unlocked) {
      KVC_RETURN_IF_ERROR(prepared.tx->Execute());
      return Appended(p, FinishAppend(*seq, prepared));
    }
    seq->BeginWrite(prepared.layer);
  }
  const absl::Status executed = prepared.tx->Execute();
  kvc::WriterMutexLock lock(&seq->mu());
  // Release and every other mutation waited for this layer's write: the sequence is live.
  seq->EndWrite(prepared.layer);
  KVC_RETURN_IF_ERROR(executed);
  return Appended(p, FinishAppend(*seq, prepared));
}

AppendResult KvStore::Appended(const AppendParams& p, AppendResult result) {
  parts_->appended_bytes.fetch_add(static_cast<int64_t>(p.keys.size() + p.values.size()),
                                   std::memory_order_relaxed);
  return result;
}

absl::Status KvStore::Fetch(const FetchParams& p, const FetchSink& sink) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(p.scope, p.sequence_id));
  const SharedReadCheck check{parts_->prefixes[static_cast<size_t>(seq->pool_index())].get(),
                              parts_->read_sampler.Next()};
  return FetchSequence(seq, p, sink, check, &parts_->fetched_bytes);
}

absl::StatusOr<CompressResult> KvStore::Compress(const CompressParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(p.scope, p.sequence_id));
  KVC_ASSIGN_OR_RETURN(const CompressInputs inputs, ValidateCompress(p, seq->geometry()));
  kvc::WriterMutexLock lock(&seq->mu());
  seq->AwaitNoWrites();
  if (seq->released()) return Released(p.sequence_id);
  // Compress reads the shared blocks (scores) and copies their survivors into blocks of the
  // sequence's own, which carry no checksum: a corrupt block must be caught before that.
  const SharedReadCheck check{parts_->prefixes[static_cast<size_t>(seq->pool_index())].get(),
                              parts_->read_sampler.Next()};
  KVC_RETURN_IF_ERROR(CheckSharedReads(*seq, {}, check));
  return CompressLocked(*seq, p, inputs);
}

absl::StatusOr<AttendResult> KvStore::Attend(const AttendParams& p) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(p.scope, p.sequence_id));
  KVC_ASSIGN_OR_RETURN(const DType dtype, ValidateAttend(p, seq->pool()->options()));
  // A writer lock: the step's weights are added to the stored tokens' scores (which an
  // append in flight may carry into its commit: it finishes first).
  kvc::WriterMutexLock lock(&seq->mu());
  seq->AwaitNoWrites();
  if (seq->released()) return Released(p.sequence_id);
  const SharedReadCheck check{parts_->prefixes[static_cast<size_t>(seq->pool_index())].get(),
                              parts_->read_sampler.Next()};
  const int layer = static_cast<int>(p.layer);
  KVC_RETURN_IF_ERROR(CheckSharedReads(*seq, absl::MakeConstSpan(&layer, 1), check));
  return AttendLocked(*seq, p, dtype, parts_->options.max_response_bytes);
}

absl::StatusOr<SequenceSnapshot> KvStore::GetSequence(const std::string& sequence_id,
                                                      const TenantScope& scope) const {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(scope, sequence_id));
  kvc::ReaderMutexLock lock(&seq->mu());
  if (seq->released()) return Released(sequence_id);
  return SnapshotLocked(*seq);
}

absl::StatusOr<ReleaseResult> KvStore::Release(const std::string& sequence_id,
                                               const TenantScope& scope) {
  return ReleaseInternal(scope, sequence_id, /*evicted=*/false);
}

absl::StatusOr<ReleaseResult> KvStore::Evict(const std::string& sequence_id,
                                             const TenantScope& scope) {
  return ReleaseInternal(scope, sequence_id, /*evicted=*/true);
}

absl::StatusOr<ReleaseResult> KvStore::ReleaseInternal(const TenantScope& scope,
                                                       const std::string& sequence_id,
                                                       bool evicted) {
  KVC_ASSIGN_OR_RETURN(std::shared_ptr<Sequence> seq, parts_->FindLive(scope, sequence_id));
  ReleaseResult result;
  {
    kvc::WriterMutexLock lock(&seq->mu());
    seq->AwaitNoWrites();  // its blocks may be under an append's write
    if (seq->released()) return Released(sequence_id);
    PoolUsage* usage = seq->usage();
    if (evicted) {
      usage->evicted_token_heads[0].fetch_add(seq->storage().stored_token_heads(),
                                              std::memory_order_relaxed);
    }
    for (auto& [format, blocks] : seq->storage().TakeAllBlocks()) {
      seq->pool()->Drop(format, blocks, Holder::kSequence);
      result.freed_blocks += static_cast<int64_t>(blocks.size());
      result.freed_bytes += static_cast<int64_t>(blocks.size()) *
                            static_cast<int64_t>(seq->pool()->layout(format).block_bytes);
    }
    seq->set_released();
    seq->SyncUsage(/*gone=*/true);
    usage->sequences.fetch_sub(1, std::memory_order_relaxed);
    seq->account()->Add(seq->pool_index(), -result.freed_bytes);
    seq->account()->RemoveSequence();
  }
  parts_->registry.Erase(scope, seq->id());  // the registry key: the id as qualified by this shard
  return result;
}

}  // namespace kvc::cachesvc
