#include "check_framework.h"

#include <memory>

namespace kvc::kernels::testing {

std::vector<CheckInfo>& Registry() {
  static std::vector<CheckInfo> registry;
  return registry;
}

void RunCheck(const CheckInfo& check, BackendKind kind, CheckContext* ctx) {
  if (!check.per_backend) {
    check.fn(*ctx);
    return;
  }
  if (!RunsOn(check, kind)) {
    ctx->Skip(Str("a check of the CPU backend only, not of ", BackendKindName(kind)));
    return;
  }
  std::unique_ptr<KernelBackend> backend, reference;
  const KernelStatus s = CreateBackend(kind, BackendOptions{}, &backend);
  if (!s.ok()) {
    ctx->Skip(Str(BackendKindName(kind), " backend unavailable: ", s.detail));
    return;
  }
  if (!ctx->ExpectOk(CreateBackend(BackendKind::kReference, BackendOptions{}, &reference),
                     "create reference backend")) {
    return;
  }
  ctx->backend = backend.get();
  ctx->reference = reference.get();
  check.fn(*ctx);
  ctx->backend = nullptr;
  ctx->reference = nullptr;
}

}  // namespace kvc::kernels::testing
