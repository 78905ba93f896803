// The leased paths (read_path.h): the flow they share, and how each brings a lease's blocks
// here — the same-node mapping (LocalReader) and a transfer channel (TransferReader).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/src/lease_decode.h"
#include "client/src/local_reader.h"
#include "client/src/read_path.h"
#include "client/src/transfer_reader.h"
#include "client/src/transfer_rpcs.h"

namespace kvc::client::internal {

absl::Status LeasedReadPath::Read(const std::string& sequence_id,
                                  const std::vector<int32_t>& layers, const CallOptions& call,
                                  const std::function<absl::Status(const LeasedBlocks&)>& read,
                                  std::string* fall_back) {
  absl::StatusOr<Lease> lease =
      client_.LeaseSequence(sequence_id, layers, absl::ZeroDuration(), call);
  if (!lease.ok()) return lease.status();
  if (absl::Status known = CheckDecodable(*lease); !known.ok()) {
    (void)client_.ReleaseLease(lease->lease_id, call);
    *fall_back = absl::StrCat("grpc (", known.message(), ")");
    return known;
  }
  const absl::Duration budget =
      call.deadline > absl::ZeroDuration() ? call.deadline : client_.options().default_deadline;
  absl::StatusOr<std::unique_ptr<LeasedBlocks>> blocks = OpenLeased(*lease, absl::Now() + budget);
  absl::Status status;
  if (blocks.ok()) {
    // The lease is held until the read ends: a mapping is the server's memory, which the
    // lease keeps from being reused (a received copy would not need it, but its decode is one
    // memory pass). The blocks go before the lease.
    status = read(**blocks);
    blocks->reset();
  } else {
    status = blocks.status();
    if (absl::IsUnimplemented(status)) {
      *fall_back = absl::StrCat("grpc (", status.message(), ")");
    } else if (!Alive()) {
      // The path broke, not the lease: this call reads over gRPC, the next decides again.
      *fall_back =
          absl::StrCat("grpc (", what(), " broke: ", absl::StatusCodeToString(status.code()), ": ",
                       status.message(), ")");
    }
  }
  (void)client_.ReleaseLease(lease->lease_id, call);  // best effort: the TTL ends it otherwise
  return status;
}

absl::Status LeasedReadPath::ReadChunks(const std::string& sequence_id, const FetchOptions& options,
                                        const ChunkFn& on_chunk, const CallOptions& call,
                                        std::string* fall_back) {
  const std::vector<int32_t> layers(options.layers.begin(), options.layers.end());
  return Read(
      sequence_id, layers, call,
      [&](const LeasedBlocks& blocks) {
        return ReadLeased(blocks.lease(), options, blocks.arenas(), on_chunk);
      },
      fall_back);
}

absl::Status LeasedReadPath::ReadInto(const std::string& sequence_id,
                                      const std::vector<int32_t>& layers,
                                      const std::vector<LayerBuffers>& buffers,
                                      const FetchIntoOptions& options, const CallOptions& call,
                                      FetchIntoResult* result, std::string* fall_back) {
  return Read(
      sequence_id, layers, call,
      [&](const LeasedBlocks& blocks) {
        return ReadLeasedInto(blocks.lease(), buffers, options, blocks.arenas(), result);
      },
      fall_back);
}

namespace {

// The same-node mapping: the lease's segments mapped read-only at their place in the arena.
class LocalReadPath final : public LeasedReadPath {
 public:
  LocalReadPath(KvCacheClient& client, std::shared_ptr<LocalReader> reader)
      : LeasedReadPath(client), reader_(std::move(reader)) {}
  std::string name() const override {
    return absl::StrCat("shared-memory (", reader_->path(), ")");
  }
  bool Alive() override { return reader_->Alive(); }

 private:
  class Mapped final : public LeasedBlocks {
   public:
    Mapped(const Lease& lease, ArenaLookup arenas) : lease_(lease), arenas_(std::move(arenas)) {}
    const Lease& lease() const override { return lease_; }
    ArenaLookup arenas() const override { return arenas_; }

   private:
    const Lease& lease_;  // the flow's, which outlives this
    const ArenaLookup arenas_;
  };
  const char* what() const override { return "the local socket"; }
  absl::StatusOr<std::unique_ptr<LeasedBlocks>> OpenLeased(const Lease& lease,
                                                           absl::Time /*deadline*/) override {
    // A device pool's arenas are GPU memory: read through kvc_client_device, or over gRPC.
    if (lease.device != "cpu") return absl::UnimplementedError("device pool");
    absl::StatusOr<ArenaLookup> arenas = reader_->Map(lease);
    if (!arenas.ok()) return arenas.status();
    return std::make_unique<Mapped>(lease, *std::move(arenas));
  }

  const std::shared_ptr<LocalReader> reader_;
};

// A transfer channel: the server sends the lease's blocks in one frame (SendLease), received
// into a payload buffer that goes back to the reader when the blocks do.
class TransferReadPath final : public LeasedReadPath {
 public:
  TransferReadPath(KvCacheClient& client, std::unique_ptr<TransferReader> reader)
      : LeasedReadPath(client), client_(client), reader_(std::move(reader)) {}
  std::string name() const override { return absl::StrCat("transfer (", reader_->where(), ")"); }
  bool Alive() override { return reader_->Alive(); }

 private:
  class Received final : public LeasedBlocks {
   public:
    Received(TransferReader& reader, ReceivedBlocks blocks)
        : reader_(reader), blocks_(std::move(blocks)) {}
    Received(const Received&) = delete;
    Received& operator=(const Received&) = delete;
    ~Received() override { reader_.Recycle(std::move(blocks_)); }
    const Lease& lease() const override { return blocks_.lease; }
    ArenaLookup arenas() const override { return blocks_.arenas(); }

   private:
    TransferReader& reader_;
    ReceivedBlocks blocks_;
  };
  const char* what() const override { return "the transfer channel"; }
  absl::StatusOr<std::unique_ptr<LeasedBlocks>> OpenLeased(const Lease& lease,
                                                           absl::Time deadline) override {
    absl::StatusOr<ReceivedBlocks> got = reader_->Fetch(
        lease,
        [&](uint64_t nonce) {
          CallOptions call;
          call.deadline = std::max(deadline - absl::Now(), absl::Milliseconds(1));
          return SendLease(client_, reader_->id(), lease.lease_id, nonce, call);
        },
        deadline);
    if (!got.ok()) return got.status();
    return std::make_unique<Received>(*reader_, *std::move(got));
  }

  KvCacheClient& client_;
  const std::unique_ptr<TransferReader> reader_;
};

}  // namespace

std::shared_ptr<ReadPath> MakeLocalReadPath(KvCacheClient& client,
                                            std::shared_ptr<LocalReader> reader) {
  return std::make_shared<LocalReadPath>(client, std::move(reader));
}

std::shared_ptr<ReadPath> MakeTransferReadPath(KvCacheClient& client,
                                               std::unique_ptr<TransferReader> reader) {
  return std::make_shared<TransferReadPath>(client, std::move(reader));
}

}  // namespace kvc::client::internal
