// Kernels of sim_self_test.cc (see sim_self_test_kernels.h). Written as CUDA, turned into
// C++ by transform.cmake.
#include "sim_self_test_kernels.h"

namespace kvc_sim_test {
namespace {

__global__ void CopyOneKernel(const int* in, int* out) { out[0] = in[0]; }

__global__ void FillKernel(int* p, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = value;
}

__global__ void AddOneKernel(int* p, int n) {
  __shared__ int tile[64];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? p[i] : 0;
  __syncthreads();
  if (i < n) p[i] = tile[threadIdx.x] + 1;
}

__global__ void SharedReadKernel(float* out, bool write_first) {
  __shared__ float tile[32];
  if (write_first) {
    tile[threadIdx.x] = static_cast<float>(blockIdx.x * 32 + threadIdx.x);
    __syncthreads();
  }
  out[blockIdx.x * 32 + threadIdx.x] = tile[threadIdx.x];
  __syncthreads();
  // The planted bug's block also writes, so that a later block would see these values if
  // shared memory kept them from block to block.
  tile[threadIdx.x] = static_cast<float>(blockIdx.x * 32 + threadIdx.x);
}

__global__ void ChainKernel(int* a) {
  if (threadIdx.x != 0) return;
  a[blockIdx.x] = blockIdx.x == 0 ? 1 : a[blockIdx.x - 1] + 1;
}

__global__ void NeighbourKernel(int* out, bool barrier) {
  __shared__ int tile[32];
  tile[threadIdx.x] = threadIdx.x;
  if (barrier) __syncthreads();
  out[threadIdx.x] = threadIdx.x == 0 ? -1 : tile[threadIdx.x - 1];
}

__global__ void DivergentWarpKernel() {
  if (threadIdx.x == 0) __syncwarp();
}

__global__ void NothingKernel() {}

}  // namespace

void LaunchCopyOne(const int* in, int* out, cudaStream_t s) {
  CopyOneKernel<<<1, 1, 0, s>>>(in, out);
}
void LaunchFill(int* p, int n, int value, cudaStream_t s) {
  FillKernel<<<(n + 63) / 64, 64, 0, s>>>(p, n, value);
}
void LaunchAddOne(int* p, int n, cudaStream_t s) {
  AddOneKernel<<<(n + 63) / 64, 64, 0, s>>>(p, n);
}
void LaunchSharedRead(float* out, int blocks, bool write_first, cudaStream_t s) {
  SharedReadKernel<<<blocks, 32, 0, s>>>(out, write_first);
}
void LaunchChain(int* a, int blocks, cudaStream_t s) { ChainKernel<<<blocks, 32, 0, s>>>(a); }
void LaunchNeighbour(int* out, bool barrier, cudaStream_t s) {
  NeighbourKernel<<<1, 32, 0, s>>>(out, barrier);
}
void LaunchDivergentWarp(cudaStream_t s) { DivergentWarpKernel<<<1, 32, 0, s>>>(); }
void LaunchTooManyThreads(cudaStream_t s) { NothingKernel<<<1, 2048, 0, s>>>(); }

}  // namespace kvc_sim_test
