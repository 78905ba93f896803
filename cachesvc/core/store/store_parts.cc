#include "cachesvc/core/store/store_parts.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cachesvc/core/base/quote.h"
#include "cachesvc/core/pool/device_block_pool.h"
#include "cachesvc/core/pool/host_block_pool.h"
#include "cachesvc/core/pool/pool_options.h"
#include "common/status_macros.h"

namespace kvc::cachesvc {

StoreParts::StoreParts(const KvStoreOptions& o)
    : options(o),
      accounts(o.quotas, static_cast<int>(o.pools.size())),
      read_sampler(o.verify_shared_reads_every) {}

StoreParts::~StoreParts() = default;

absl::StatusOr<std::unique_ptr<StoreParts>> StoreParts::Create(const KvStoreOptions& options) {
  if (options.pools.empty()) {
    return absl::InvalidArgumentError("at least one pool must be configured");
  }
  if (options.max_sequences < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequences is ", options.max_sequences, "; expected >= 1"));
  }
  if (options.verify_shared_reads_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("verify_shared_reads_every is ",
                                                   options.verify_shared_reads_every,
                                                   "; expected >= 1 (1 = verify every read)"));
  }
  std::unique_ptr<StoreParts> store(new StoreParts(options));
  KVC_ASSIGN_OR_RETURN(store->shard,
                       ShardIdentity::Create(options.shard_name, options.shard_weight));
  const kernels::KernelStatus ks = kernels::CreateBackend(
      kernels::BackendKind::kCpu, kernels::BackendOptions(), &store->backend);
  KVC_RETURN_IF_ERROR(FromKernelStatus(ks, "creating the CPU kernel backend"));
  if (options.hooks.wrap_backend) {
    store->backend = options.hooks.wrap_backend(std::move(store->backend));
  }
  absl::flat_hash_set<std::string> names;
  for (const PoolOptions& pool_options : options.pools) {
    if (!names.insert(pool_options.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool name '", pool_options.name, "' is configured twice"));
    }
    KVC_RETURN_IF_ERROR(ValidatePoolOptions(pool_options));
    KVC_ASSIGN_OR_RETURN(const int ordinal, ParsePoolDevice(pool_options.device));
    std::unique_ptr<BlockPool> pool;
    if (ordinal < 0) {
      KVC_ASSIGN_OR_RETURN(pool, HostBlockPool::Create(pool_options, store->backend.get()));
    } else {
      KVC_ASSIGN_OR_RETURN(kernels::KernelBackend * device,
                           store->DeviceBackend(ordinal, pool_options.name));
      KVC_ASSIGN_OR_RETURN(pool,
                           DeviceBlockPool::Create(pool_options, device, store->backend.get()));
    }
    if (options.hooks.wrap_pool) pool = options.hooks.wrap_pool(std::move(pool));
    store->pools.push_back(std::move(pool));
    store->usage.push_back(std::make_unique<PoolUsage>());
    store->prefixes.push_back(std::make_unique<PrefixIndex>(store->pools.back().get()));
    PrefixIndex* index = store->prefixes.back().get();
    store->pools.back()->set_reclaimer([index](int64_t bytes) { return index->Reclaim(bytes); });
  }
  store->leases =
      std::make_unique<LeaseTable>(options.leases, static_cast<int>(store->pools.size()));
  return store;
}

absl::StatusOr<kernels::KernelBackend*> StoreParts::DeviceBackend(int ordinal,
                                                                  const std::string& pool) {
  for (const auto& [have, backend] : device_backends) {
    if (have == ordinal) return backend.get();
  }
  std::unique_ptr<kernels::KernelBackend> backend;
  kernels::BackendOptions backend_options;
  backend_options.device = ordinal;
  const kernels::KernelStatus ks =
      kernels::CreateBackend(kernels::BackendKind::kCuda, backend_options, &backend);
  if (!ks.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", pool, "': device 'cuda:", ordinal, "' cannot be used: ", ks.detail,
        kernels::CudaBackendCompiled()
            ? " (this kvcached has the CUDA backend; the node needs an NVIDIA driver and a GPU "
              "of compute capability 8.0 or newer visible to the process)"
            : " (this kvcached was built without CUDA; build it with nvcc on PATH, or serve the "
              "pool on device 'cpu')"));
  }
  if (options.hooks.wrap_backend) backend = options.hooks.wrap_backend(std::move(backend));
  device_backends.emplace_back(ordinal, std::move(backend));
  return device_backends.back().second.get();
}

absl::StatusOr<BlockPool*> StoreParts::FindPool(const std::string& name) const {
  if (name.empty()) return pools.front().get();
  std::vector<std::string> names;
  for (const auto& pool : pools) {
    if (pool->options().name == name) return pool.get();
    names.push_back(pool->options().name);
  }
  return absl::NotFoundError(absl::StrCat(
      "pool ", Quoted(name), " not found; this server has: ", absl::StrJoin(names, ", ")));
}

int StoreParts::PoolIndex(const BlockPool* pool) const {
  int index = 0;
  while (pools[static_cast<size_t>(index)].get() != pool) ++index;
  return index;
}

absl::StatusOr<std::shared_ptr<Sequence>> StoreParts::FindLive(const TenantScope& scope,
                                                               const std::string& id) const {
  if (id.empty()) return absl::InvalidArgumentError("sequence_id is empty");
  KVC_ASSIGN_OR_RETURN(const std::string key, shard.Resolve(id));
  return registry.Find(scope, key);
}

}  // namespace kvc::cachesvc
