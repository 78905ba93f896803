// Small kernels with planted bugs (and their correct twins) for sim_self_test.cc; compiled
// through transform.cmake like kernels/cuda, so they run on cudasim as the real ones do.
#pragma once

#include <cuda_runtime.h>

namespace kvc_sim_test {

// out[0] = in[0] on the device.
void LaunchCopyOne(const int* in, int* out, cudaStream_t s);
// p[i] = value for i < n.
void LaunchFill(int* p, int n, int value, cudaStream_t s);
// p[i] += 1 for i < n, through a static __shared__ tile (blocks of 64 threads).
void LaunchAddOne(int* p, int n, cudaStream_t s);
// One block of 32 threads per grid block: out[32 b + t] = tile[t] read from a static
// __shared__ tile, before (planted bug) or after every thread wrote it in this block.
void LaunchSharedRead(float* out, int blocks, bool write_first, cudaStream_t s);
// Block b's thread 0 sets a[b] = a[b - 1] + 1 (a[0] = 1): a result only ordered blocks give.
void LaunchChain(int* a, int blocks, cudaStream_t s);
// Thread t of one block of 32 writes tile[t] = t and reads tile[t - 1], with or without the
// __syncthreads between (planted bug: none); out[t] = what it read (-1 for t = 0).
void LaunchNeighbour(int* out, bool barrier, cudaStream_t s);
// Lane 0 alone calls a full-warp __syncwarp: a collective the other lanes never reach.
void LaunchDivergentWarp(cudaStream_t s);
// A block of 2048 threads: an invalid launch configuration.
void LaunchTooManyThreads(cudaStream_t s);

}  // namespace kvc_sim_test
