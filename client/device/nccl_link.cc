#include "kvc/client/nccl_link.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/device/device_decode.h"
#include "client/src/lease_payload.h"
#include "client/src/transfer_rpcs.h"
#include "common/mutex.h"
#include "kvc/kernels/backend.h"
#include "transfer/nccl_api.h"
#include "transfer/payload.h"
#include "transfer/wire.h"

namespace kvc::client {

namespace {}  // namespace

struct NcclLink::Impl {
  KvCacheClient* client = nullptr;
  Options options;
  const nccl::Api* api = nullptr;
  NcclTransfer transfer;
  std::unique_ptr<kernels::KernelBackend> backend;
  kernels::StreamHandle stream;
  bool stream_made = false;

  kvc::Mutex op_mu;  // one FetchInto or Append at a time
  bool broken ABSL_GUARDED_BY(op_mu) = false;
  uint64_t nonce ABSL_GUARDED_BY(op_mu) = 0;
  std::unique_ptr<internal::Scratch> payload ABSL_GUARDED_BY(op_mu);
  size_t payload_bytes ABSL_GUARDED_BY(op_mu) = 0;
  std::unique_ptr<internal::Scratch> header;

  // The communicator, aborted by the watchdog when a receive outlives its deadline (the
  // server stopped sending). Set once in Open.
  std::unique_ptr<nccl::GuardedComm> comm;
  kvc::Mutex wait_mu;
  absl::Time wait_until ABSL_GUARDED_BY(wait_mu) = absl::InfiniteFuture();
  // Earlier than wait_until when the call beside the operations failed: the server gave up
  // on them, so they are given up on soon after (unless they finish, as when the server
  // refused the append after receiving it).
  absl::Time give_up_by ABSL_GUARDED_BY(wait_mu) = absl::InfiniteFuture();
  bool stopping ABSL_GUARDED_BY(wait_mu) = false;
  std::atomic<bool> stalled{false};
  std::thread watchdog;

  nccl::Result State() { return comm == nullptr ? -1 : comm->State(); }
  void Abort() {
    if (comm != nullptr) comm->Abort();
  }
  void Watch() {
    for (;;) {
      {
        kvc::MutexLock lock(&wait_mu);
        if (stopping) return;
        if (absl::Now() > std::min(wait_until, give_up_by) && !stalled.exchange(true)) {
          wait_until = absl::InfiniteFuture();
          Abort();
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  // Waits for an operation that answered `r`, then for the stream that runs it, within
  // `deadline` (the watchdog aborts the communicator past it).
  absl::Status Finish(nccl::Result r, const char* what, absl::Time deadline) {
    {
      kvc::MutexLock lock(&wait_mu);
      wait_until = deadline;
    }
    while (r == nccl::kInProgress) {
      absl::SleepFor(absl::Microseconds(50));
      r = State();
    }
    absl::Status status = api->Check(r, what);
    if (status.ok()) {
      status = internal::FromKernel(backend->Synchronize(stream), what);
      if (status.ok()) status = api->Check(State(), what);
    }
    {
      kvc::MutexLock lock(&wait_mu);
      wait_until = absl::InfiniteFuture();
    }
    if (!status.ok() && stalled) {
      return absl::DeadlineExceededError(
          absl::StrCat(what,
                       ": the server did not complete it before the call's deadline or gave "
                       "up on it; the transfer is closed"));
    }
    return status;
  }
  absl::Status Broken() const {
    return absl::UnavailableError(
        absl::StrCat("NCCL transfer ", transfer.transfer_id, " broke earlier; open another"));
  }
  // A failure mid-frame: the byte stream is out of step, so the transfer is done with.
  absl::Status Break(std::future<absl::Status>& sending, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu) {
    broken = true;
    Abort();
    (void)sending.get();  // the server's send fails once the communicator is gone
    return why;
  }
  absl::Status Receive(void* dst, size_t bytes, absl::Time deadline) {
    const nccl::Result r = comm->Recv(dst, bytes, stream.native);
    if (r == -1) return absl::UnavailableError("the NCCL transfer was aborted");
    return Finish(r, "ncclRecv", deadline);
  }
  absl::Status Send(const void* src, size_t bytes, absl::Time deadline) {
    const nccl::Result r = comm->Send(src, bytes, stream.native);
    if (r == -1) return absl::UnavailableError("the NCCL transfer was aborted");
    return Finish(r, "ncclSend", deadline);
  }
  // The frame header an Append sends first, in device memory (NCCL sends nothing else).
  absl::Status SendHeader(const transfer::FrameHeader& h, absl::Time deadline) {
    char host[transfer::kHeaderBytes];
    transfer::EncodeHeader(h, host);
    KVC_RETURN_IF_KERNEL_ERROR(backend->CopyToDevice(header->get(), host, sizeof(host), stream),
                               "frame header");
    KVC_RETURN_IF_KERNEL_ERROR(backend->Synchronize(stream), "frame header");
    return Send(header->get(), sizeof(host), deadline);
  }

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    {
      kvc::MutexLock lock(&wait_mu);
      stopping = true;
    }
    if (watchdog.joinable()) watchdog.join();
    Abort();
    if (!transfer.transfer_id.empty()) (void)internal::CloseTransfer(*client, transfer.transfer_id);
    header.reset();
    {
      kvc::MutexLock lock(&op_mu);
      payload.reset();
    }
    if (stream_made) backend->DestroyStream(stream);
  }
};

NcclLink::NcclLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NcclLink::~NcclLink() = default;

std::string NcclLink::Describe() const {
  return absl::StrCat(impl_->api->Describe(), ", transfer ", impl_->transfer.transfer_id);
}

absl::StatusOr<std::unique_ptr<NcclLink>> NcclLink::Open(KvCacheClient* client,
                                                         const Options& options,
                                                         const CallOptions& call) {
  if (!kernels::CudaBackendCompiled()) {
    return absl::UnavailableError("this build of the kvcache client has no CUDA backend");
  }
  auto impl = std::make_unique<Impl>();
  impl->client = client;
  impl->options = options;
  absl::StatusOr<const nccl::Api*> api = nccl::Load(options.library);
  if (!api.ok()) return api.status();
  impl->api = *api;
  kernels::BackendOptions backend_options;
  backend_options.device = options.device;
  if (const kernels::KernelStatus ks =
          kernels::CreateBackend(kernels::BackendKind::kCuda, backend_options, &impl->backend);
      !ks.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA backend for cuda:", options.device, ": ", ks.detail));
  }
  KVC_RETURN_IF_KERNEL_ERROR(impl->backend->CreateStream(&impl->stream), "NcclLink: stream");
  impl->stream_made = true;
  impl->header = std::make_unique<internal::Scratch>(impl->backend.get());
  KVC_RETURN_IF_KERNEL_ERROR(impl->header->Allocate(transfer::kHeaderBytes),
                             "NcclLink: header buffer");
  absl::StatusOr<NcclTransfer> transfer = internal::OpenNcclTransfer(*client, options.pool, call);
  if (!transfer.ok()) return transfer.status();
  impl->transfer = *std::move(transfer);
  if (impl->transfer.unique_id.size() != nccl::kUniqueIdBytes) {
    return absl::InternalError("the server's NCCL unique id is not 128 bytes");
  }
  nccl::UniqueId id{};
  std::memcpy(id.internal, impl->transfer.unique_id.data(), nccl::kUniqueIdBytes);
  KVC_RETURN_IF_KERNEL_ERROR(impl->backend->BindThread(), "NcclLink: device");
  // Nonblocking: a join the server never completes can be given up on.
  impl->comm = std::make_unique<nccl::GuardedComm>(impl->api);
  nccl::Result r = impl->comm->Join(id, 1);
  if (r != nccl::kSuccess && r != nccl::kInProgress) {
    return impl->api->Check(r, "ncclCommInitRankConfig");
  }
  impl->watchdog = std::thread([p = impl.get()] { p->Watch(); });
  const absl::Time join_by = absl::Now() + absl::Milliseconds(impl->transfer.connect_within_ms);
  while (r == nccl::kInProgress && absl::Now() < join_by) {
    absl::SleepFor(absl::Milliseconds(1));
    r = impl->State();
  }
  if (r != nccl::kSuccess) {
    return r == nccl::kInProgress
               ? absl::UnavailableError("the NCCL transfer was not joined in time")
               : impl->api->Check(r, "joining the NCCL transfer");
  }
  return std::unique_ptr<NcclLink>(new NcclLink(std::move(impl)));
}

absl::StatusOr<FetchIntoResult> NcclLink::FetchInto(const std::string& sequence_id,
                                                    const std::vector<LayerBuffers>& buffers,
                                                    const FetchIntoOptions& options,
                                                    const CallOptions& call) {
  Impl& m = *impl_;
  absl::StatusOr<std::vector<int32_t>> layers = internal::CheckDeviceBuffers(buffers, options);
  if (!layers.ok()) return layers.status();
  kvc::MutexLock lock(&m.op_mu);
  if (m.broken) return m.Broken();
  absl::StatusOr<Lease> lease =
      m.client->LeaseSequence(sequence_id, *layers, absl::ZeroDuration(), call);
  if (!lease.ok()) return lease.status();
  std::optional<internal::LeaseRelease> release;
  release.emplace(m.client, lease->lease_id, call);
  absl::StatusOr<internal::PayloadPlan> plan = internal::PlanPayload(*lease);
  if (!plan.ok()) return plan.status();
  const auto payload_bytes = static_cast<size_t>(plan->layout.total_bytes());
  if (m.payload == nullptr || m.payload_bytes < payload_bytes) {
    m.payload = std::make_unique<internal::Scratch>(m.backend.get());
    m.payload_bytes = 0;
    KVC_RETURN_IF_KERNEL_ERROR(m.payload->Allocate(std::max<size_t>(payload_bytes, 1)),
                               "NcclLink: payload buffer");
    m.payload_bytes = payload_bytes;
  }
  KVC_RETURN_IF_KERNEL_ERROR(m.backend->BindThread(), "NcclLink: device");
  const absl::Duration budget =
      call.deadline > absl::ZeroDuration() ? call.deadline : m.client->options().default_deadline;
  const absl::Time deadline = absl::Now() + budget;
  const uint64_t nonce = ++m.nonce;
  std::future<absl::Status> sending = std::async(std::launch::async, [&] {
    return internal::SendLease(*m.client, m.transfer.transfer_id, lease->lease_id, nonce, call);
  });
  absl::Status got = m.Receive(m.header->get(), transfer::kHeaderBytes, deadline);
  if (!got.ok()) return m.Break(sending, got);
  char host[transfer::kHeaderBytes];
  got = internal::FromKernel(m.backend->CopyToHost(host, m.header->get(), sizeof(host), m.stream),
                             "frame header");
  if (got.ok()) got = internal::FromKernel(m.backend->Synchronize(m.stream), "frame header");
  if (!got.ok()) return m.Break(sending, got);
  transfer::FrameHeader h;
  if (!transfer::DecodeHeader(host, &h) || h.nonce != nonce) {
    return m.Break(sending,
                   absl::InternalError("the NCCL transfer sent another frame than this one's"));
  }
  if (h.code != 0) {
    // Refused before the payload (the transfer stays in step): the call says why.
    const absl::Status refused = sending.get();
    return refused.ok() ? absl::InternalError("SendLease succeeded but sent no payload") : refused;
  }
  if (h.payload_bytes != payload_bytes) {
    return m.Break(sending,
                   absl::InternalError(absl::StrCat("the frame announces ", h.payload_bytes,
                                                    " bytes; the lease has ", payload_bytes)));
  }
  char* base = static_cast<char*>(m.payload->get());
  // One receive per piece the server sends (transfer/payload.h).
  for (const transfer::Piece& piece : plan->layout.Pieces()) {
    got = m.Receive(base + piece.offset, static_cast<size_t>(piece.bytes), deadline);
    if (!got.ok()) return m.Break(sending, got);
  }
  if (const absl::Status sent = sending.get(); !sent.ok()) {
    m.broken = true;
    m.Abort();
    return sent;
  }
  release.reset();  // the blocks are this process's copy now
  return internal::DecodeOnDevice(
      plan->lease,
      [&](StorageFormat format) {
        const auto f = static_cast<int>(format);
        return internal::DeviceArena{base + plan->layout.offset(f), plan->layout.blocks(f)};
      },
      m.backend.get(), buffers, options);
}

absl::StatusOr<AppendResult> NcclLink::Append(const AppendChunk& chunk, const CallOptions& call) {
  Impl& m = *impl_;
  constexpr auto kMaxBytes = static_cast<size_t>(transfer::kMaxNcclAppendBytes);
  if (chunk.keys == nullptr || chunk.values == nullptr || chunk.bytes < 1 ||
      chunk.bytes > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclLink::Append needs device keys and values of 1 .. ", kMaxBytes, " bytes each; got ",
        chunk.bytes, " bytes",
        chunk.keys == nullptr || chunk.values == nullptr ? " and a null pointer" : ""));
  }
  kvc::MutexLock lock(&m.op_mu);
  if (m.broken) return m.Broken();
  KVC_RETURN_IF_KERNEL_ERROR(m.backend->BindThread(), "NcclLink: device");
  const absl::Duration budget =
      call.deadline > absl::ZeroDuration() ? call.deadline : m.client->options().default_deadline;
  const absl::Time deadline = absl::Now() + budget;
  const uint64_t nonce = ++m.nonce;
  std::future<absl::StatusOr<AppendResult>> appending = std::async(std::launch::async, [&] {
    absl::StatusOr<AppendResult> r =
        internal::AppendOverTransfer(*m.client, chunk, m.transfer.transfer_id, nonce, call);
    if (!r.ok()) {
      // Refused after the server received everything, the sends finish at once; refused
      // before, nobody receives them.
      kvc::MutexLock wait(&m.wait_mu);
      m.give_up_by = absl::Now() + absl::Seconds(2);
    }
    return r;
  });
  absl::Status sent = m.SendHeader({nonce, 2 * static_cast<uint64_t>(chunk.bytes), 0}, deadline);
  if (sent.ok()) sent = m.Send(chunk.keys, chunk.bytes, deadline);
  if (sent.ok()) sent = m.Send(chunk.values, chunk.bytes, deadline);
  if (!sent.ok()) {
    // Out of step: the server's receive ends when the communicator goes.
    m.broken = true;
    m.Abort();
  }
  absl::StatusOr<AppendResult> result = appending.get();
  {
    kvc::MutexLock wait(&m.wait_mu);
    m.give_up_by = absl::InfiniteFuture();
  }
  if (!sent.ok()) return result.ok() ? sent : result.status();  // the server's reason says more
  return result;
}

}  // namespace kvc::client
