#!/usr/bin/env bash
# Enforces the one-way layering of docs/ARCHITECTURE.md "Layers" by forbidden includes (CMake target links
# enforce the rest). Exit 1 with every violation listed.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
check() {  # check DESCRIPTION REGEX PATH...
  local what=$1 regex=$2
  shift 2
  local hits
  hits=$(grep -rnE "$regex" "$@" --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "check_deps: $what:"
    echo "$hits" | sed 's/^/  /'
    status=1
  fi
}
inc='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]'
check "kernels/ must not include gRPC, Abseil, protobuf or Prometheus" \
  "${inc}(grpc|grpcpp|absl|google/protobuf|prometheus)/|${inc}[^>\"]*\.pb\.h" kernels
check "cachesvc/core must not include gRPC, protobuf or Prometheus" \
  "${inc}(grpc|grpcpp|google/protobuf|prometheus)/|${inc}[^>\"]*\.pb\.h" cachesvc/core
check "cachesvc/transport must not include gRPC, protobuf, Prometheus or the RPC layer" \
  "${inc}(grpc|grpcpp|google/protobuf|prometheus|cachesvc/rpc|cachesvc/server|cachesvc/security|cachesvc/metrics)/|${inc}[^>\"]*\.pb\.h" \
  cachesvc/transport
check "transfer/ is a leaf (Abseil, common/ and the standard library only)" \
  "${inc}(grpc|grpcpp|google/protobuf|prometheus|kvc|cachesvc|client|proto|kernels)/" transfer
check "CUDA and NCCL headers belong in kernels/cuda only" \
  "${inc}(cuda_runtime|cuda|nccl)[._a-z]*\.h" common transfer proto cachesvc client worker
check "client/ and worker/ must not include cachesvc/" "${inc}cachesvc/" client worker
# Each target's include root holds only what it may see (kvc_expose, cmake/KvcHelpers.cmake);
# a relative path would step around it.
check "project includes are full paths, never relative with \"../\"" \
  "${inc}([^>\"]*/)?\.\./" common transfer proto cachesvc client worker kernels tests
# worker/ shares the kernels' thread pool and RoPE helpers, through their public headers only.
check "worker/ may use kernels/ only through its public headers (kvc/kernels/*)" \
  "${inc}kernels/" worker
check "public client headers must not expose generated protobuf or gRPC types" \
  "${inc}(grpc|grpcpp|google/protobuf)/|${inc}[^>\"]*\.pb\.h" client/include
check "common/ is a leaf (Abseil, libcrypto and the standard library only)" \
  "${inc}(grpc|grpcpp|google/protobuf|prometheus|kvc|cachesvc|client|proto)/" common
# Bookkeeping apart from bytes: the core reaches pool memory only through kernel ops, so
# the same code serves a device pool. Only the pools themselves set their arenas' base.
check "cachesvc/core must not read or write pool memory (use a KernelBackend op)" \
  "KeyRecord|ValueRecord|BlockBase|record_codec\\.h|memcpy\\([^)]*arena|\\.base\\b|HostArena" \
  $(ls cachesvc/core/*/*.h cachesvc/core/*/*.cc | grep -v -e host_block_pool -e host_arena -e block_copy_out \
    -e device_block_pool)
# A TenantScope is made in the RPC layer from the authenticated caller (tenant_scope.h); below
# it, scopes are only passed on and compared.
check "cachesvc/core and cachesvc/transport never make a TenantScope from a name" \
  "TenantScope( [a-z_]+)?[({][^)}]" cachesvc/transport $(ls -d cachesvc/core/*/ | grep -v /base/) \
  $(ls cachesvc/core/base/* | grep -v tenant_scope.h)
[ $status = 0 ] && echo "check_deps: layering OK"
exit $status
