#include "cachesvc/transport/lease_sender.h"

#include <array>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cachesvc/core/base/backend_buffer.h"
#include "cachesvc/core/base/quote.h"
#include "common/status_macros.h"
#include "transfer/payload.h"

namespace kvc::cachesvc {
namespace {

constexpr size_t kFormats = kernels::kNumStorageFormats;

// The payload's number of a storage format: kvcache.v1's (the kernels' plus one).
int PayloadFormat(size_t f) { return static_cast<int>(f) + 1; }

}  // namespace

absl::StatusOr<SentBlocks> SendLeasedBlocks(const LeaseService& leases, const TenantScope& scope,
                                            const std::string& lease_id, BlockSink* sink) {
  KVC_ASSIGN_OR_RETURN(const LeaseTable::Pinned pinned, leases.PinnedLease(scope, lease_id));
  BlockPool* const pool = pinned.pool;
  std::array<int64_t, transfer::kMaxFormats> blocks{};
  std::array<int64_t, transfer::kMaxFormats> block_bytes{};
  for (size_t f = 0; f < kFormats; ++f) {
    const auto p = static_cast<size_t>(PayloadFormat(f));
    blocks[p] = static_cast<int64_t>(pinned.held[f].size());
    block_bytes[p] = static_cast<int64_t>(pool->layout(static_cast<StorageFormat>(f)).block_bytes);
  }
  KVC_ASSIGN_OR_RETURN(const transfer::PayloadLayout layout,
                       transfer::PayloadLayout::Make(blocks, block_bytes));
  const BlockPool* const sink_pool = sink->SendsFromPool();
  const bool to_pool_memory = sink_pool != nullptr;
  std::vector<char> host_piece;
  std::optional<BackendBuffer> pool_piece;  // to_pool_memory: the pieces, in the pool's memory
  if (to_pool_memory) {
    if (sink_pool != pool) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lease ", Quoted(lease_id), " is of pool ", Quoted(pool->options().name),
          "; this transfer carries pool ", Quoted(sink_pool->options().name), "'s leases"));
    }
    if (pool->options().device == "cpu") {
      return absl::FailedPreconditionError(
          absl::StrCat("lease ", Quoted(lease_id), " is of pool ", Quoted(pool->options().name),
                       ", in host memory: this transfer sends device pools' blocks only"));
    }
    KVC_RETURN_IF_ERROR(sink->Reserve(layout.largest_piece()));
    KVC_ASSIGN_OR_RETURN(
        pool_piece,
        BackendBuffer::Allocate(pool->backend(), static_cast<size_t>(layout.largest_piece())));
    if (const kernels::KernelStatus ks = pool->backend()->BindThread(); !ks.ok()) {
      return absl::InternalError(absl::StrCat("cannot use the pool's device: ", ks.detail));
    }
  }
  KVC_RETURN_IF_ERROR(sink->Begin(layout.total_blocks(), layout.total_bytes()));
  // Each piece is written before the next is copied.
  for (const transfer::Piece& piece : layout.Pieces()) {
    const auto f = static_cast<size_t>(piece.format - 1);
    const auto format = static_cast<StorageFormat>(f);
    const auto at = static_cast<size_t>(piece.first_block);
    const auto count = static_cast<size_t>(piece.blocks);
    char* data = nullptr;
    if (to_pool_memory) {
      data = static_cast<char*>(pool_piece->data());
    } else {
      host_piece.resize(static_cast<size_t>(piece.bytes));
      data = host_piece.data();
    }
    KVC_RETURN_IF_ERROR(pool->CopyBlocksOut(
        format, absl::Span<const BlockId>(pinned.held[f]).subspan(at, count),
        absl::Span<const int32_t>(pinned.slots[f]).subspan(at, count), data,
        to_pool_memory ? BlockPool::CopyTo::kPoolMemory : BlockPool::CopyTo::kHost));
    // Checked after the copy: live now means live (and pinned) throughout it.
    if (!leases.LeaseLive(scope, lease_id)) {
      return absl::AbortedError(absl::StrCat("lease ", Quoted(lease_id),
                                             " ended while its blocks were sent; lease again"));
    }
    KVC_RETURN_IF_ERROR(sink->Write(data, static_cast<size_t>(piece.bytes)));
  }
  return SentBlocks{layout.total_blocks(), layout.total_bytes()};
}

}  // namespace kvc::cachesvc
