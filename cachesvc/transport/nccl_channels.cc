#include "cachesvc/transport/nccl_channels.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cachesvc/core/base/quote.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transfer/wire.h"

namespace kvc::cachesvc {

// Receive-buffer bytes per scope and in all, against NcclChannelOptions' budgets. A Charge
// holds bytes until it is destroyed or reset (RAII: a channel gives its buffer's bytes back
// when it is dropped, however that happens).
class NcclChannels::Budget {
 public:
  Budget(int64_t per_tenant, int64_t total) : per_tenant_(per_tenant), total_(total) {}

  class Charge {
   public:
    Charge() = default;
    Charge(std::shared_ptr<Budget> budget, TenantScope scope, int64_t bytes)
        : budget_(std::move(budget)), scope_(std::move(scope)), bytes_(bytes) {}
    Charge(Charge&& other) noexcept { *this = std::move(other); }
    Charge& operator=(Charge&& other) noexcept {
      Reset();
      budget_ = std::move(other.budget_);
      scope_ = std::move(other.scope_);
      bytes_ = std::exchange(other.bytes_, 0);
      return *this;
    }
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    ~Charge() { Reset(); }
    void Reset() {
      if (budget_ != nullptr && bytes_ > 0) budget_->Give(scope_, bytes_);
      bytes_ = 0;
    }

   private:
    std::shared_ptr<Budget> budget_;
    TenantScope scope_;
    int64_t bytes_ = 0;
  };

  // `bytes` more for `scope`, or RESOURCE_EXHAUSTED naming the budget it would pass.
  // `what` names the buffer ("an Append over NCCL needs a receive buffer").
  static absl::StatusOr<Charge> Take(const std::shared_ptr<Budget>& self, const TenantScope& scope,
                                     int64_t bytes, const char* what) {
    Budget& b = *self;
    kvc::MutexLock lock(&b.mu_);
    int64_t& mine = b.by_scope_[scope];
    const auto refuse = [&](const std::string& who, int64_t held, const char* budget,
                            int64_t limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " of ", bytes, " bytes; ", who, " holds ", held,
                       " bytes of NCCL buffers, its budget (", budget, ") is ", limit,
                       ": close idle NCCL transfers or raise the budget"));
    };
    if (mine + bytes > b.per_tenant_) {
      const int64_t held = mine;
      if (mine == 0) b.by_scope_.erase(scope);
      return refuse(absl::StrCat("tenant ", Quoted(scope.tenant())), held,
                    "transfer_nccl_receive_bytes_per_tenant", b.per_tenant_);
    }
    if (b.all_ + bytes > b.total_) {
      if (mine == 0) b.by_scope_.erase(scope);
      return refuse("the server", b.all_, "transfer_nccl_receive_bytes", b.total_);
    }
    mine += bytes;
    b.all_ += bytes;
    return Charge(self, scope, bytes);
  }

 private:
  void Give(const TenantScope& scope, int64_t bytes) {
    kvc::MutexLock lock(&mu_);
    all_ -= bytes;
    auto it = by_scope_.find(scope);
    if (it != by_scope_.end() && (it->second -= bytes) <= 0) by_scope_.erase(it);
  }

  const int64_t per_tenant_;
  const int64_t total_;
  kvc::Mutex mu_;
  absl::flat_hash_map<TenantScope, int64_t> by_scope_ ABSL_GUARDED_BY(mu_);
  int64_t all_ ABSL_GUARDED_BY(mu_) = 0;
};

// One channel: its communicator (rank 0, on its pool's device), the stream its operations
// run on, a header buffer in pool memory (NCCL moves device memory only) and the buffer
// Appends receive keys and values into (grown to the largest Append, kept until closed).
struct NcclChannels::Channel {
  explicit Channel(const nccl::Api* a) : api(a), comm(a) {}
  const nccl::Api* const api;
  TenantScope scope;
  BlockPool* pool = nullptr;
  absl::Time opened;
  kvc::Mutex op_mu;  // one send or receive at a time, in call order
  bool joined ABSL_GUARDED_BY(op_mu) = false;
  bool broken ABSL_GUARDED_BY(op_mu) = false;
  std::optional<BackendBuffer> header;
  Budget::Charge incoming_charge ABSL_GUARDED_BY(op_mu);  // incoming_bytes, against the budgets
  std::optional<BackendBuffer> incoming ABSL_GUARDED_BY(op_mu);
  size_t incoming_bytes ABSL_GUARDED_BY(op_mu) = 0;
  kernels::StreamHandle stream;

  // Used by the sending thread, aborted by the watchdog or on close.
  nccl::GuardedComm comm;
  // When the NCCL wait in progress must have finished (watchdog); InfiniteFuture: none.
  kvc::Mutex wait_mu;
  absl::Time wait_until ABSL_GUARDED_BY(wait_mu) = absl::InfiniteFuture();
  std::atomic<bool> stalled{false};  // the watchdog aborted a wait

  nccl::Result State() { return comm.State(); }
  void Abort() { comm.Abort(); }
  // One NCCL operation (`post` enqueues it), waited for: until it is enqueued (nonblocking
  // comms answer kInProgress first), then until the stream has run it (the peer took or gave
  // the bytes). The watchdog aborts the comm past `until`, which ends either wait.
  absl::Status Run(const char* what, absl::Time until, const std::function<nccl::Result()>& post);
  // Reads the frame header received into `header`.
  absl::StatusOr<transfer::FrameHeader> ReceivedHeader();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {
    Abort();
    if (pool != nullptr) pool->backend()->DestroyStream(stream);
  }
};

// Sends a SendLease's frame on a joined channel: the header, then each piece as it comes.
class NcclChannels::Sink final : public BlockSink {
 public:
  Sink(Channel* c, uint64_t nonce, absl::Time until, std::shared_ptr<Budget> budget,
       TenantScope scope)
      : c_(c), nonce_(nonce), until_(until), budget_(std::move(budget)), scope_(std::move(scope)) {}
  const BlockPool* SendsFromPool() const override { return c_->pool; }
  // The piece buffer is device memory like the receive buffers: the same budgets, held for
  // this send.
  absl::Status Reserve(int64_t bytes) override {
    absl::StatusOr<Budget::Charge> charge =
        Budget::Take(budget_, scope_, bytes, "a send over NCCL needs a piece buffer");
    if (!charge.ok()) return charge.status();
    charge_ = *std::move(charge);
    return absl::OkStatus();
  }
  absl::Status Begin(int64_t /*blocks*/, int64_t bytes) override {
    begun_ = true;
    return SendHeader({nonce_, static_cast<uint64_t>(bytes), 0});
  }
  absl::Status Write(const char* data, size_t bytes) override {
    return c_->Run("ncclSend", until_,
                   [&] { return c_->comm.Send(data, bytes, c_->stream.native); });
  }
  bool begun() const { return begun_; }

  absl::Status SendHeader(const transfer::FrameHeader& h) {
    char host[transfer::kHeaderBytes];
    transfer::EncodeHeader(h, host);
    kernels::KernelBackend* b = c_->pool->backend();
    kernels::KernelStatus ks = b->CopyToDevice(c_->header->data(), host, sizeof(host), c_->stream);
    if (ks.ok()) ks = b->Synchronize(c_->stream);
    if (!ks.ok()) return absl::InternalError(absl::StrCat("NCCL frame header: ", ks.detail));
    const char* device = static_cast<const char*>(c_->header->data());
    return c_->Run("ncclSend", until_,
                   [&] { return c_->comm.Send(device, sizeof(host), c_->stream.native); });
  }

 private:
  Channel* const c_;
  const uint64_t nonce_;
  const absl::Time until_;
  const std::shared_ptr<Budget> budget_;
  const TenantScope scope_;
  Budget::Charge charge_;
  bool begun_ = false;
};

absl::Status NcclChannels::Channel::Run(const char* what, absl::Time until,
                                        const std::function<nccl::Result()>& post) {
  {
    kvc::MutexLock lock(&wait_mu);
    wait_until = until;
  }
  absl::Status status = [&] {
    nccl::Result r = post();
    if (r == -1) return absl::UnavailableError("the transfer was aborted");
    while (r == nccl::kInProgress) {
      absl::SleepFor(absl::Microseconds(50));
      r = State();
    }
    KVC_RETURN_IF_ERROR(api->Check(r, what));
    const kernels::KernelStatus ks = pool->backend()->Synchronize(stream);
    if (!ks.ok()) return absl::UnavailableError(absl::StrCat(what, ": ", ks.detail));
    return api->Check(State(), what);
  }();
  {
    kvc::MutexLock lock(&wait_mu);
    wait_until = absl::InfiniteFuture();
  }
  if (!status.ok() && stalled) {
    return absl::DeadlineExceededError(
        absl::StrCat("the peer did not complete an ", what,
                     " within its time (write_stall or the call's deadline); the transfer is "
                     "closed: open another"));
  }
  return status;
}

absl::StatusOr<transfer::FrameHeader> NcclChannels::Channel::ReceivedHeader() {
  char host[transfer::kHeaderBytes];
  kernels::KernelBackend* b = pool->backend();
  kernels::KernelStatus ks = b->CopyToHost(host, header->data(), sizeof(host), stream);
  if (ks.ok()) ks = b->Synchronize(stream);
  if (!ks.ok()) return absl::InternalError(absl::StrCat("NCCL frame header: ", ks.detail));
  transfer::FrameHeader h;
  if (!transfer::DecodeHeader(host, &h)) {
    return absl::AbortedError("what arrived is not a frame header (the transfer is out of step)");
  }
  return h;
}

absl::StatusOr<std::unique_ptr<NcclChannels>> NcclChannels::Start(const NcclChannelOptions& options,
                                                                  LeaseService* leases) {
  KVC_ASSIGN_OR_RETURN(const nccl::Api* api, nccl::Load(options.library));
  std::unique_ptr<NcclChannels> n(new NcclChannels(options, leases, api));
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

NcclChannels::NcclChannels(const NcclChannelOptions& options, LeaseService* leases,
                           const nccl::Api* api)
    : options_(options),
      leases_(leases),
      api_(api),
      budget_(std::make_shared<Budget>(options.receive_bytes_per_tenant, options.receive_bytes)) {}

absl::StatusOr<OpenedTransfer> NcclChannels::Open(const TenantScope& scope,
                                                  const std::string& pool_name) {
  KVC_ASSIGN_OR_RETURN(BlockPool * pool, leases_->FindPool(pool_name));
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
  OpenedTransfer o;
  const absl::Time now = absl::Now();
  KVC_ASSIGN_OR_RETURN(o.id,
                       channels_.Add(std::move(c), [&](Channel& ch) { return Done(ch, now); }));
  o.nccl_unique_id.assign(id.internal, sizeof(id.internal));
  o.connect_within_ms = absl::ToInt64Milliseconds(options_.connect_within);
  o.nccl_version = api_->version;
  Event("opened");
  return o;
}

bool NcclChannels::Done(Channel& c, absl::Time now) {
  if (!c.op_mu.TryLock()) return false;  // sending or receiving: in use
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
  c.op_mu.Unlock();
  if (done) Event("closed");
  return done;
}

absl::Status NcclChannels::Ready(Channel& c, const std::string& id, absl::Time deadline) {
  c.op_mu.AssertHeld();
  if (c.broken) {
    return absl::UnavailableError(
        absl::StrCat("transfer ", Quoted(id), " broke in an earlier call; open another"));
  }
  if (const kernels::KernelStatus ks = c.pool->backend()->BindThread(); !ks.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot use the pool's device: ", ks.detail));
  }
  // The peer joins before its first call, but the two joins finish apart: wait for ours
  // within the channel's join time.
  const absl::Time join_by = std::min(deadline, c.opened + options_.connect_within);
  while (!c.joined) {
    const nccl::Result state = c.State();
    if (state == nccl::kSuccess) {
      c.joined = true;
      Event("connected");
    } else if (state != nccl::kInProgress || absl::Now() > join_by) {
      c.broken = true;
      c.Abort();
      return absl::FailedPreconditionError(absl::StrCat(
          "transfer ", Quoted(id),
          state != nccl::kInProgress
              ? absl::StrCat(" could not be joined: ",
                             api_->Check(state, "ncclCommInitRank").message())
              : " was not joined in time: the peer joins (rank 1, the unique id) within "
                "connect_within_ms of OpenTransfer, then calls SendLease or Append"));
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclChannels::Receive(const TenantScope& scope, const std::string& id, uint64_t nonce,
                                   int64_t bytes, absl::Time deadline, const ApplyReceived& apply) {
  std::shared_ptr<Channel> c = channels_.Find(scope, id);
  if (c == nullptr) return ScopedChannels<Channel>::Unknown(id);
  kvc::MutexLock lock(&c->op_mu);
  KVC_RETURN_IF_ERROR(Ready(*c, id, deadline));
  // Whatever fails before the last byte arrived leaves the peer's sends unmatched: the
  // channel is out of step for good.
  const auto fail = [&](absl::Status why) {
    c->op_mu.AssertHeld();  // called below, under `lock`
    Event("failed");
    c->broken = true;
    c->Abort();  // the peer's sends fail at once
    // A broken channel never receives again: its buffer goes back now, not when it is dropped.
    c->incoming.reset();
    c->incoming_bytes = 0;
    c->incoming_charge.Reset();
    return why;
  };
  if (bytes < 1 || bytes > transfer::kMaxNcclAppendBytes) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("nccl.bytes is ", bytes, "; expected 1 .. ", transfer::kMaxNcclAppendBytes,
                     " (split larger appends); the transfer is closed: open another")));
  }
  const auto need = static_cast<size_t>(2 * bytes);
  if (c->incoming_bytes < need) {
    c->incoming.reset();
    c->incoming_bytes = 0;
    c->incoming_charge.Reset();
    absl::StatusOr<Budget::Charge> charge = Budget::Take(
        budget_, scope, static_cast<int64_t>(need), "an Append over NCCL needs a receive buffer");
    if (!charge.ok()) {
      return fail(absl::Status(charge.status().code(), absl::StrCat(charge.status().message(),
                                                                    "; this transfer is closed")));
    }
    absl::StatusOr<BackendBuffer> grown = BackendBuffer::Allocate(c->pool->backend(), need);
    if (!grown.ok()) return fail(grown.status());
    c->incoming = *std::move(grown);
    c->incoming_bytes = need;
    c->incoming_charge = *std::move(charge);
  }
  const absl::Time until = std::min(deadline, absl::Now() + options_.write_stall);
  char* const keys = static_cast<char*>(c->incoming->data());
  char* const values = keys + bytes;
  const auto recv = [&](char* into, size_t n) {
    return c->Run("ncclRecv", until, [&] { return c->comm.Recv(into, n, c->stream.native); });
  };
  char* const header = static_cast<char*>(c->header->data());
  if (absl::Status got = recv(header, transfer::kHeaderBytes); !got.ok()) return fail(got);
  absl::StatusOr<transfer::FrameHeader> h = c->ReceivedHeader();
  if (!h.ok()) return fail(h.status());
  if (h->nonce != nonce || h->payload_bytes != need || h->code != 0) {
    return fail(absl::AbortedError(
        absl::StrCat("the frame on transfer ", Quoted(id), " is another call's (nonce ", h->nonce,
                     ", ", h->payload_bytes, " bytes; this Append's: nonce ", nonce, ", ", need,
                     "): two calls raced on one transfer; it is closed: open another")));
  }
  for (char* into : {keys, values}) {
    if (absl::Status got = recv(into, static_cast<size_t>(bytes)); !got.ok()) return fail(got);
  }
  Event("received");
  // In step again: what `apply` refuses leaves the channel usable.
  return apply(keys, values, c->pool->options().device);
}

absl::Status NcclChannels::Close(const TenantScope& scope, const std::string& id) {
  KVC_RETURN_IF_ERROR(channels_.Close(scope, id));
  Event("closed");
  return absl::OkStatus();  // the comm is aborted when the last send on it is done
}

absl::StatusOr<SentBlocks> NcclChannels::Send(const TenantScope& scope, const std::string& id,
                                              const std::string& lease_id, uint64_t nonce,
                                              absl::Time deadline) {
  std::shared_ptr<Channel> c = channels_.Find(scope, id);
  if (c == nullptr) return ScopedChannels<Channel>::Unknown(id);
  kvc::MutexLock lock(&c->op_mu);
  KVC_RETURN_IF_ERROR(Ready(*c, id, deadline));
  const absl::Time until = std::min(deadline, absl::Now() + options_.write_stall);
  Sink sink(c.get(), nonce, until, budget_, scope);
  absl::StatusOr<SentBlocks> sent = SendLeasedBlocks(*leases_, scope, lease_id, &sink);
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
    {
      // Let go of the channels before sleeping: a closed channel ends (and gives its receive
      // buffer back) at once, not up to a sleep later.
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
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace kvc::cachesvc
