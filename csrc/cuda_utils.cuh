// Device helpers shared by the CUDA kernels: launch geometry for row-wise ops, warp/group sums and a
// deterministic block reduction.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

namespace margrpo::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRowBlock = 256;  // threads per block of the row-wise kernels

// Row-wise kernels give each row a group of `lanes` adjacent lanes of one warp (a power of two, at
// most 32, at least the channel count when it fits): C = 16 puts two rows in a warp, so a warp reads
// 32 consecutive elements, and a group's sum is a few shuffles without shared memory.
inline int lanes_per_row(int64_t channels) {
  int lanes = 1;
  while (lanes < channels && lanes < kWarpSize) lanes *= 2;
  return lanes;
}

// Blocks for `rows` rows at kRowBlock / lanes rows per block; the kernels loop (grid-stride) past
// this cap, which keeps the grid within limits for any number of rows.
inline unsigned row_blocks(int64_t rows, int lanes) {
  const int64_t rows_per_block = kRowBlock / lanes;
  const int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(needed, int64_t(1) << 16)));
}

// Sum over each aligned group of `lanes` lanes (a power of two <= 32); every lane of the group gets
// the sum. All 32 lanes of the warp must call it (full-mask shuffles).
template <typename T>
__device__ __forceinline__ T group_sum(T v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// A fixed-order (hence deterministic) block reduction of N values per thread, with combine(a, b)
// applied per slot; the result is valid in thread 0. blockDim.x must be a multiple of 32, <= 1024.
template <typename T, int N, typename Combine>
__device__ void block_reduce(T (&v)[N], Combine combine) {
  __shared__ T warp_partials[kWarpSize][N];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int s = 0; s < N; ++s) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      v[s] = combine(s, v[s], __shfl_down_sync(kFullMask, v[s], offset));
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < N; ++s) warp_partials[warp][s] = v[s];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int s = 0; s < N; ++s) {
      // lanes past the last warp re-read warp 0's value and are combined only when lane < warps
      T x = warp_partials[lane < warps ? lane : 0][s];
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const T other = __shfl_down_sync(kFullMask, x, offset);
        if (lane + offset < warps) x = combine(s, x, other);
      }
      v[s] = x;
    }
  }
  __syncthreads();  // warp_partials may be reused by the caller's next reduction
}

}  // namespace margrpo::cuda
