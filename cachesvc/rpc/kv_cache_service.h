// gRPC KvCacheService over a KvStore. Handlers convert, call the store, convert back;
// no lock is held across a network read or write.
#pragma once

#include "cachesvc/core/base/tenant_scope.h"
#include "cachesvc/core/store/kv_store.h"
#include "cachesvc/metrics/metrics.h"
#include "cachesvc/rpc/endpoints.h"
#include "cachesvc/security/access_control.h"
#include "cachesvc/transport/nccl_channels.h"
#include "cachesvc/transport/staging_regions.h"
#include "cachesvc/transport/transfers.h"
#include "kvcache/v1/kvcache_service.grpc.pb.h"

namespace kvc::cachesvc {

class KvCacheServiceImpl final : public kvcache::v1::KvCacheService::Service {
 public:
  // `metrics` may be null; `staging` too (no local socket: a staged Append is refused) and
  // `nccl` (no transfer_nccl_library: Appends over NCCL are refused). `transfers`: the
  // transfer kinds offered (transfers.h); `endpoints`: the local token leases carry. All
  // outlive the service.
  KvCacheServiceImpl(KvStore* store, Metrics* metrics, const AccessControl* access,
                     const Transfers* transfers, const Endpoints* endpoints,
                     const StagingRegions* staging = nullptr, NcclChannels* nccl = nullptr)
      : store_(store),
        metrics_(metrics),
        access_(access),
        transfers_(transfers),
        endpoints_(endpoints),
        staging_(staging),
        nccl_(nccl) {}

  grpc::Status LookupPrefix(grpc::ServerContext* context,
                            const kvcache::v1::LookupPrefixRequest* request,
                            kvcache::v1::LookupPrefixResponse* response) override;
  grpc::Status PublishPrefix(grpc::ServerContext* context,
                             const kvcache::v1::PublishPrefixRequest* request,
                             kvcache::v1::PublishPrefixResponse* response) override;
  grpc::Status CreateSequence(grpc::ServerContext* context,
                              const kvcache::v1::CreateSequenceRequest* request,
                              kvcache::v1::SequenceInfo* response) override;
  grpc::Status ForkSequence(grpc::ServerContext* context,
                            const kvcache::v1::ForkSequenceRequest* request,
                            kvcache::v1::SequenceInfo* response) override;
  grpc::Status LeaseSequence(grpc::ServerContext* context, const kvcache::v1::LeaseRequest* request,
                             kvcache::v1::Lease* response) override;
  grpc::Status RenewLease(grpc::ServerContext* context,
                          const kvcache::v1::RenewLeaseRequest* request,
                          kvcache::v1::RenewLeaseResponse* response) override;
  grpc::Status ReleaseLease(grpc::ServerContext* context,
                            const kvcache::v1::ReleaseLeaseRequest* request,
                            kvcache::v1::ReleaseLeaseResponse* response) override;
  grpc::Status OpenTransfer(grpc::ServerContext* context,
                            const kvcache::v1::OpenTransferRequest* request,
                            kvcache::v1::OpenTransferResponse* response) override;
  grpc::Status SendLease(grpc::ServerContext* context, const kvcache::v1::SendLeaseRequest* request,
                         kvcache::v1::SendLeaseResponse* response) override;
  grpc::Status CloseTransfer(grpc::ServerContext* context,
                             const kvcache::v1::CloseTransferRequest* request,
                             kvcache::v1::CloseTransferResponse* response) override;
  grpc::Status Append(grpc::ServerContext* context, const kvcache::v1::AppendRequest* request,
                      kvcache::v1::AppendResponse* response) override;
  grpc::Status AppendStream(grpc::ServerContext* context,
                            grpc::ServerReader<kvcache::v1::AppendRequest>* reader,
                            kvcache::v1::AppendStreamResponse* response) override;
  grpc::Status Fetch(grpc::ServerContext* context, const kvcache::v1::FetchRequest* request,
                     grpc::ServerWriter<kvcache::v1::FetchChunk>* writer) override;
  grpc::Status GetSequence(grpc::ServerContext* context,
                           const kvcache::v1::GetSequenceRequest* request,
                           kvcache::v1::SequenceInfo* response) override;
  grpc::Status Release(grpc::ServerContext* context, const kvcache::v1::ReleaseRequest* request,
                       kvcache::v1::ReleaseResponse* response) override;
  grpc::Status Compress(grpc::ServerContext* context, const kvcache::v1::CompressRequest* request,
                        kvcache::v1::CompressResponse* response) override;
  grpc::Status Attend(grpc::ServerContext* context, const kvcache::v1::AttendRequest* request,
                      kvcache::v1::AttendResponse* response) override;
  grpc::Status AttendStream(grpc::ServerContext* context,
                            grpc::ServerReaderWriter<kvcache::v1::AttendResponse,
                                                     kvcache::v1::AttendRequest>* stream) override;

 private:
  absl::Status AttendOne(const TenantScope& scope, const kvcache::v1::AttendRequest& request,
                         kvcache::v1::AttendResponse* response);
  // An Append's params in `scope`, its keys and values viewing the scope's staging region
  // when the request is staged (`hold` then keeps the region mapped until the params are
  // dropped).
  absl::StatusOr<AppendParams> AppendFromProto(const kvcache::v1::AppendRequest& request,
                                               const TenantScope& scope,
                                               std::shared_ptr<const StagingRegion>* hold) const;
  // An Append whose keys and values come over an NCCL transfer of `scope`'s (request.nccl).
  absl::StatusOr<AppendResult> AppendOverNccl(const kvcache::v1::AppendRequest& request,
                                              const TenantScope& scope, absl::Time deadline);

  KvStore* store_;
  Metrics* metrics_;
  const AccessControl* access_;
  const Transfers* transfers_;
  const Endpoints* endpoints_;
  const StagingRegions* staging_;
  NcclChannels* nccl_;
};

}  // namespace kvc::cachesvc
