// trajectory_std_fwd / _bwd on CUDA. Forward: a group of adjacent lanes per row m (coalesced across
// rows of C = 16), each lane a shifted two-pass mean / variance over the K trajectories of its
// channels (the second pass re-reads from cache), the channel mean by warp shuffles. Backward: one
// thread per (m, c), which recomputes its mean and std and writes the K gradients.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"
#include "trajectory_std.h"

namespace margrpo::trajectory_std {
namespace {

using cuda::group_sum;
using cuda::kRowBlock;

// Population std over K of element e (= m * C + c) of a [K, M * C] tensor, two-pass on the
// differences from trajectory 0's value (`shift`): a large offset would otherwise drown a small spread
// in the rounding of the mean (as in trajectory_std.cpp). `mean` is the mean of those differences.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void moments(const scalar_t* __restrict__ samples, int64_t K, int64_t MC, int64_t e,
                                        acc_t& shift, acc_t& mean, acc_t& std) {
  shift = acc_t(samples[e]);
  acc_t sum = 0;
  for (int64_t k = 1; k < K; ++k) sum += acc_t(samples[k * MC + e]) - shift;
  mean = sum / acc_t(K);
  acc_t sq = 0;
  for (int64_t k = 0; k < K; ++k) {
    const acc_t d = (acc_t(samples[k * MC + e]) - shift) - mean;
    sq += d * d;
  }
  std = std::sqrt(sq / acc_t(K));
}

template <typename scalar_t, typename acc_t>
__global__ void fwd_kernel(const scalar_t* __restrict__ samples, acc_t* __restrict__ out, int64_t K, int64_t M,
                           int64_t C, int lanes) {
  const int rows_per_block = kRowBlock / lanes;
  const int lane = threadIdx.x % lanes;
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < M; first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t m = first + threadIdx.x / lanes;
    acc_t total = 0;
    if (m < M) {
      for (int64_t c = lane; c < C; c += lanes) {
        acc_t shift, mean, std;
        moments<scalar_t, acc_t>(samples, K, M * C, m * C + c, shift, mean, std);
        total += std;
      }
    }
    total = group_sum(total, lanes);  // uniform loop bound: every lane of the warp is here
    if (m < M && lane == 0) out[m] = total / acc_t(C);
  }
}

template <typename scalar_t, typename acc_t>
__global__ void bwd_kernel(const acc_t* __restrict__ grad_out, const scalar_t* __restrict__ samples,
                           acc_t* __restrict__ grad, int64_t K, int64_t M, int64_t C) {
  const int64_t MC = M * C;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < MC; e += int64_t(gridDim.x) * blockDim.x) {
    acc_t shift, mean, std;
    moments<scalar_t, acc_t>(samples, K, MC, e, shift, mean, std);
    // d std / d sample = (sample - mean) / (K std); defined as 0 where the std is 0
    const acc_t scale = std > acc_t(0) ? grad_out[e / C] / acc_t(C) / (acc_t(K) * std) : acc_t(0);
    for (int64_t k = 0; k < K; ++k) grad[k * MC + e] = ((acc_t(samples[k * MC + e]) - shift) - mean) * scale;
  }
}

at::Tensor fwd_cuda(const at::Tensor& samples_in) {
  const at::Tensor samples = prepare("trajectory_std_fwd", samples_in);
  const c10::cuda::CUDAGuard guard(samples.device());
  const int64_t K = samples.size(0), M = samples.size(1), C = samples.size(2);
  at::Tensor out = at::empty({M}, samples.options().dtype(acc_dtype(samples.scalar_type())));
  if (M == 0) return out;
  if (C == 0) return out.fill_(NAN);  // the mean over no channels
  const int lanes = cuda::lanes_per_row(C);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, samples.scalar_type(), "trajectory_std_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    fwd_kernel<scalar_t, acc_t><<<cuda::row_blocks(M, lanes), kRowBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        samples.data_ptr<scalar_t>(), out.data_ptr<acc_t>(), K, M, C, lanes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor bwd_cuda(const at::Tensor& grad_out, const at::Tensor& samples_in) {
  const char* op = "trajectory_std_bwd";
  const at::Tensor samples = prepare(op, samples_in);
  const c10::cuda::CUDAGuard guard(samples.device());
  const at::Tensor g = prepare_grad(op, grad_out, samples);
  const int64_t K = samples.size(0), M = samples.size(1), C = samples.size(2);
  at::Tensor grad = at::empty({K, M, C}, samples.options().dtype(g.scalar_type()));
  if (grad.numel() == 0) return grad;
  const int64_t blocks = std::min<int64_t>((M * C + kRowBlock - 1) / kRowBlock, int64_t(1) << 16);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, samples.scalar_type(), "trajectory_std_bwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    bwd_kernel<scalar_t, acc_t><<<unsigned(blocks), kRowBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<acc_t>(), samples.data_ptr<scalar_t>(), grad.data_ptr<acc_t>(), K, M, C);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad;
}

}  // namespace
}  // namespace margrpo::trajectory_std

TORCH_LIBRARY_IMPL(margrpo, CUDA, m) {
  m.impl("trajectory_std_fwd", &margrpo::trajectory_std::fwd_cuda);
  m.impl("trajectory_std_bwd", &margrpo::trajectory_std::bwd_cuda);
}
