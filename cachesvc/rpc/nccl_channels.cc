#include "cachesvc/rpc/nccl_channels.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachesvc/core/quote.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/transfer_wire.h"

namespace kvc::cachesvc {

// One channel: its communicator (rank 0, on its pool's device), the stream its sends run on
// and a header buffer in pool memory (NCCL sends device memory only).
struct NcclChannels::Channel {
  explicit Channel(const nccl::Api* a) : api(a), comm(a) {}
  const nccl::Api* const api;
  std::string scope;
  BlockPool* pool = nullptr;
  absl::Time opened;
  kvc::Mutex send_mu;  // one send at a time, in call order
  bool joined ABSL_GUARDED_BY(send_mu) = false;
  bool broken ABSL_GUARDED_BY(send_mu) = false;
  std::optional<BackendBuffer> header;
  kernels::StreamHandle stream;

  // Used by the sending thread, aborted by the watchdog or on close.
  nccl::GuardedComm comm;
  // When the NCCL wait in progress must have finished (watchdog); InfiniteFuture: none.
  kvc::Mutex wait_mu;
  absl::Time wait_until ABSL_GUARDED_BY(wait_mu) = absl::InfiniteFuture();
  std::atomic<bool> stalled{false};  // the watchdog aborted a wait

  nccl::Result State() { return comm.State(); }
  void Abort() { comm.Abort(); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {
    Abort();
    if (pool != nullptr) pool->backend()->DestroyStream(stream);
  }
};

// Sends a SendLease's frame on a joined channel: the header, then each piece as it comes.
class NcclChannels::Sink final : public KvStore::BlockSink {
 public:
  Sink(Channel* c, uint64_t nonce, absl::Time until) : c_(c), nonce_(nonce), until_(until) {}
  const BlockPool* SendsFromPool() const override { return c_->pool; }
  absl::Status Begin(int64_t /*blocks*/, int64_t bytes) override {
    begun_ = true;
    return SendHeader({nonce_, static_cast<uint64_t>(bytes), 0});
  }
  absl::Status Write(const char* data, size_t bytes) override { return Post(data, bytes); }
  bool begun() const { return begun_; }

  absl::Status SendHeader(const transfer::FrameHeader& h) {
    char host[transfer::kHeaderBytes];
    transfer::EncodeHeader(h, host);
    kernels::KernelBackend* b = c_->pool->backend();
    kernels::KernelStatus ks = b->CopyToDevice(c_->header->data(), host, sizeof(host), c_->stream);
    if (ks.ok()) ks = b->Synchronize(c_->stream);
    if (!ks.ok()) return absl::InternalError(absl::StrCat("NCCL frame header: ", ks.detail));
    return Post(static_cast<const char*>(c_->header->data()), sizeof(host));
  }

 private:
  // One ncclSend, waited for: until it is enqueued (nonblocking comms answer kInProgress
  // first), then until the stream has run it (the peer received it). The watchdog aborts the
  // comm past until_, which ends either wait.
  absl::Status Post(const char* data, size_t bytes) {
    {
      kvc::MutexLock lock(&c_->wait_mu);
      c_->wait_until = until_;
    }
    absl::Status status = PostAndWait(data, bytes);
    {
      kvc::MutexLock lock(&c_->wait_mu);
      c_->wait_until = absl::InfiniteFuture();
    }
    if (!status.ok() && c_->stalled) {
      return absl::DeadlineExceededError(
          "the reader did not receive within the send's time (write_stall or the call's "
          "deadline); the transfer is closed: open another");
    }
    return status;
  }
  absl::Status PostAndWait(const char* data, size_t bytes) {
    nccl::Result r = c_->comm.Send(data, bytes, c_->stream.native);
    if (r == -1) return absl::UnavailableError("the transfer was aborted");
    while (r == nccl::kInProgress) {
      absl::SleepFor(absl::Microseconds(50));
      r = c_->State();
    }
    KVC_RETURN_IF_ERROR(c_->api->Check(r, "ncclSend"));
    const kernels::KernelStatus ks = c_->pool->backend()->Synchronize(c_->stream);
    if (!ks.ok()) return absl::UnavailableError(absl::StrCat("ncclSend: ", ks.detail));
    return c_->api->Check(c_->State(), "ncclSend");
  }

  Channel* const c_;
  const uint64_t nonce_;
  const absl::Time until_;
  bool begun_ = false;
};

absl::StatusOr<std::unique_ptr<NcclChannels>> NcclChannels::Start(const NcclChannelOptions& options,
                                                                  KvStore* store) {
  KVC_ASSIGN_OR_RETURN(const nccl::Api* api, nccl::Load(options.library));
  std::unique_ptr<NcclChannels> n(new NcclChannels(options, store, api));
  n->watchdog_ = std::thread([p = n.get()] { p->Watch(); });
  return n;
}

NcclChannels::~NcclChannels() {
  {
    kvc::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  channels_.Clear();  // each aborts its comm
}

bool NcclChannels::Names(const std::string& id) { return absl::StartsWith(id, "n-"); }

absl::StatusOr<NcclChannels::Opened> NcclChannels::Open(const std::string& scope,
                                                        const std::string& pool_name) {
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, store_->FindPool(pool_name));
  if (pool->options().device == "cpu") {
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", Quoted(pool->options().name),
                     " is in host memory: NCCL transfers carry device pools' blocks (open a "
                     "TCP transfer for host pools)"));
  }
  auto c = std::make_shared<Channel>(api_);
  c->scope = scope;
  c->pool = pool;
  c->opened = absl::Now();
  kernels::KernelBackend* b = pool->backend();
  KVC_ASSIGN_OR_RETURN(BackendBuffer header, BackendBuffer::Allocate(b, transfer::kHeaderBytes));
  c->header = std::move(header);
  if (const kernels::KernelStatus ks = b->CreateStream(&c->stream); !ks.ok()) {
    c->pool = nullptr;  // no stream to destroy
    return absl::UnavailableError(absl::StrCat("cannot make a stream: ", ks.detail));
  }
  if (const kernels::KernelStatus ks = b->BindThread(); !ks.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot use the pool's device: ", ks.detail));
  }
  nccl::UniqueId id{};
  KVC_RETURN_IF_ERROR(api_->Check(api_->get_unique_id(&id), "ncclGetUniqueId"));
  // Nonblocking: the join completes when the reader joins.
  if (const nccl::Result r = c->comm.Join(id, 0); r != nccl::kSuccess && r != nccl::kInProgress) {
    return api_->Check(r, "ncclCommInitRankConfig");
  }
  Opened o;
  const absl::Time now = absl::Now();
  KVC_ASSIGN_OR_RETURN(o.id,
                       channels_.Add(std::move(c), [&](Channel& ch) { return Done(ch, now); }));
  o.unique_id.assign(id.internal, sizeof(id.internal));
  o.connect_within_ms = absl::ToInt64Milliseconds(options_.connect_within);
  o.nccl_version = api_->version;
  Event("opened");
  return o;
}

bool NcclChannels::Done(Channel& c, absl::Time now) {
  if (!c.send_mu.TryLock()) return false;  // sending: in use
  bool done = c.broken;
  if (!done && !c.joined) {
    const nccl::Result state = c.State();
    if (state == nccl::kSuccess) {
      c.joined = true;
      Event("connected");
    } else {
      done = state != nccl::kInProgress || now - c.opened > options_.connect_within;
    }
  }
  c.send_mu.Unlock();
  if (done) Event("closed");
  return done;
}

absl::Status NcclChannels::Close(const std::string& scope, const std::string& id) {
  KVC_RETURN_IF_ERROR(channels_.Close(scope, id));
  Event("closed");
  return absl::OkStatus();  // the comm is aborted when the last send on it is done
}

absl::StatusOr<KvStore::SentBlocks> NcclChannels::Send(const std::string& scope,
                                                       const std::string& id,
                                                       const std::string& lease_id, uint64_t nonce,
                                                       absl::Time deadline) {
  std::shared_ptr<Channel> c = channels_.Find(scope, id);
  if (c == nullptr) return ScopedChannels<Channel>::Unknown(id);
  kvc::MutexLock lock(&c->send_mu);
  if (c->broken) {
    return absl::UnavailableError(
        absl::StrCat("transfer ", Quoted(id), " broke in an earlier send; open another"));
  }
  if (const kernels::KernelStatus ks = c->pool->backend()->BindThread(); !ks.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot use the pool's device: ", ks.detail));
  }
  // The reader joins before it asks for a send, but the two joins finish apart: wait for
  // ours within the channel's join time.
  const absl::Time join_by = std::min(deadline, c->opened + options_.connect_within);
  while (!c->joined) {
    const nccl::Result state = c->State();
    if (state == nccl::kSuccess) {
      c->joined = true;
      Event("connected");
    } else if (state != nccl::kInProgress || absl::Now() > join_by) {
      c->broken = true;
      c->Abort();
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer ", Quoted(id),
          state != nccl::kInProgress
              ? absl::StrCat(" could not be joined: ",
                             api_->Check(state, "ncclCommInitRank").message())
              : " was not joined in time: the reader joins (rank 1, the unique id) within "
                "connect_within_ms of OpenTransfer, then sends SendLease"));
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  const absl::Time until = std::min(deadline, absl::Now() + options_.write_stall);
  Sink sink(c.get(), nonce, until);
  absl::StatusOr<KvStore::SentBlocks> sent = store_->SendLeasedBlocks(scope, lease_id, &sink);
  if (sent.ok()) {
    Event("sent");
    return sent;
  }
  Event("failed");
  if (!sink.begun() && !c->stalled) {
    // Nothing of a payload went out: a header with the code keeps the channel in step.
    if (sink.SendHeader({nonce, 0, static_cast<uint32_t>(sent.status().code())}).ok()) {
      return sent.status();
    }
  }
  c->broken = true;
  c->Abort();  // the reader's receives fail at once
  return sent.status();
}

void NcclChannels::Watch() {
  for (;;) {
    {
      kvc::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const std::vector<std::shared_ptr<Channel>> all = channels_.All();
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<Channel>& c : all) {
      bool late = false;
      {
        kvc::MutexLock lock(&c->wait_mu);
        late = now > c->wait_until;
      }
      if (late && !c->stalled.exchange(true)) {
        KVC_LOG(WARNING) << "NCCL transfer: a reader stopped receiving; aborting its channel";
        c->Abort();
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace kvc::cachesvc
