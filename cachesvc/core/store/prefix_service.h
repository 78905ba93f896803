// PrefixService: the prefix cache over a KvStore's pools (prefix_index.h, prefix_attach.h).
// A published prefix's whole blocks are shared by later sequences created with the same
// tokens, model, salt and storage format. Thread-safe, as KvStore.
#pragma once

#include "absl/status/statusor.h"
#include "cachesvc/core/base/requests.h"
#include "cachesvc/core/base/types.h"
#include "cachesvc/core/sequence/sequence.h"
#include "cachesvc/core/store/store_parts.h"

namespace kvc::cachesvc {

class PrefixService {
 public:
  explicit PrefixService(StoreParts& parts) : parts_(parts) {}

  // How many leading tokens are cached now (a hint: nothing is held).
  absl::StatusOr<LookupPrefixResult> LookupPrefix(const LookupPrefixParams& params);
  // Makes the sequence's leading whole blocks, while never evicted, moved or rotated and
  // visible on every layer, reusable by CreateSequence with the same model, salt and format.
  // FAILED_PRECONDITION for a sequence with a raw residual window.
  absl::StatusOr<PublishPrefixResult> PublishPrefix(const PublishPrefixParams& params);
  // Shares the longest cached prefix of `prefix` into `seq`, a new sequence nobody else can
  // see yet (KvStore::CreateSequence).
  absl::Status Attach(Sequence& seq, int pool_index, const PrefixSpec& prefix);

 private:
  StoreParts& parts_;
};

}  // namespace kvc::cachesvc
