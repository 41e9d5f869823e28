// gaussian_logprob_fwd / _bwd on CUDA: one pass, a group of adjacent lanes per row (coalesced loads
// across rows of C = 16), channel sums by warp shuffles, fp32 (fp64) math.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"
#include "gaussian_logprob.h"

namespace margrpo::gaussian {
namespace {

using cuda::group_sum;
using cuda::kRowBlock;

template <typename scalar_t, typename acc_t>
__global__ void fwd_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ mean,
                           const scalar_t* __restrict__ std, acc_t* __restrict__ out, int64_t rows, int64_t C,
                           bool per_row_std, int reduce, int lanes) {
  const int rows_per_block = kRowBlock / lanes;
  const int lane = threadIdx.x % lanes;
  const acc_t nan = std::numeric_limits<acc_t>::quiet_NaN();
  const acc_t log_sqrt_2pi = acc_t(kLogSqrt2Pi);
  // the loop bound is uniform over the block, so every lane reaches the shuffles of group_sum
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < rows; first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t r = first + threadIdx.x / lanes;
    acc_t total = 0;
    if (r < rows) {
      const acc_t row_std = per_row_std ? acc_t(std[r]) : acc_t(0);
      const acc_t row_log_std = per_row_std ? std::log(row_std) : acc_t(0);
      for (int64_t c = lane; c < C; c += lanes) {
        const int64_t i = r * C + c;
        const acc_t s = per_row_std ? row_std : acc_t(std[i]);
        const acc_t log_s = per_row_std ? row_log_std : std::log(s);
        const acc_t z = (acc_t(x[i]) - acc_t(mean[i])) / s;
        const acc_t elem = s > acc_t(0) ? acc_t(-0.5) * z * z - log_s - log_sqrt_2pi : nan;
        if (reduce == kNone) {
          out[i] = elem;
        } else {
          total += elem;  // a NaN element makes the row NaN, as in the reference
        }
      }
    }
    if (reduce != kNone) {
      total = group_sum(total, lanes);
      if (r < rows && lane == 0) out[r] = reduce == kMean ? total / acc_t(C) : total;
    }
  }
}

template <typename scalar_t, typename acc_t>
__global__ void bwd_kernel(const acc_t* __restrict__ grad_out, const scalar_t* __restrict__ x,
                           const scalar_t* __restrict__ mean, const scalar_t* __restrict__ std,
                           acc_t* __restrict__ grad_x, acc_t* __restrict__ grad_mean, acc_t* __restrict__ grad_std,
                           int64_t rows, int64_t C, bool per_row_std, int reduce, int lanes) {
  const int rows_per_block = kRowBlock / lanes;
  const int lane = threadIdx.x % lanes;
  // a per-row std of a single-channel row is the per-element case: no sum over channels
  const bool sum_std = per_row_std && C != 1;
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < rows; first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t r = first + threadIdx.x / lanes;
    acc_t std_sum = 0;
    if (r < rows) {
      acc_t ge_row = 0;
      if (reduce != kNone) ge_row = reduce == kMean ? grad_out[r] / acc_t(C) : grad_out[r];
      for (int64_t c = lane; c < C; c += lanes) {
        const int64_t i = r * C + c;
        const acc_t ge = reduce == kNone ? grad_out[i] : ge_row;
        const acc_t s = acc_t(per_row_std ? std[r] : std[i]);
        acc_t gx, gs;
        element_grads(ge, acc_t(x[i]) - acc_t(mean[i]), s, gx, gs);
        grad_x[i] = gx;
        grad_mean[i] = -gx;
        if (sum_std) {
          std_sum += gs;
        } else {
          grad_std[i] = gs;
        }
      }
    }
    if (sum_std) {
      std_sum = group_sum(std_sum, lanes);
      if (r < rows && lane == 0) grad_std[r] = std_sum;
    }
  }
}

at::Tensor fwd_cuda(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, int64_t reduce) {
  const Args a = prepare("gaussian_logprob_fwd", x, mean, std, reduce);
  const c10::cuda::CUDAGuard guard(a.x.device());
  const auto out_dtype = acc_dtype(a.x.scalar_type());
  at::Tensor out = a.reduce == kNone ? at::empty({a.rows, a.channels}, a.x.options().dtype(out_dtype))
                                     : at::empty({a.rows}, a.x.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  if (a.channels == 0) return out.fill_(a.reduce == kMean ? NAN : 0.0);  // sum over no channels; mean is 0/0
  const int lanes = cuda::lanes_per_row(a.channels);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "gaussian_logprob_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    fwd_kernel<scalar_t, acc_t><<<cuda::row_blocks(a.rows, lanes), kRowBlock, 0, stream>>>(
        a.x.data_ptr<scalar_t>(), a.mean.data_ptr<scalar_t>(), a.std.data_ptr<scalar_t>(), out.data_ptr<acc_t>(),
        a.rows, a.channels, a.per_row_std, int(a.reduce), lanes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cuda(const at::Tensor& grad_out, const at::Tensor& x,
                                                        const at::Tensor& mean, const at::Tensor& std,
                                                        int64_t reduce) {
  const char* op = "gaussian_logprob_bwd";
  const Args a = prepare(op, x, mean, std, reduce);
  const c10::cuda::CUDAGuard guard(a.x.device());
  const at::Tensor g = prepare_grad(op, grad_out, a);
  const auto options = a.x.options().dtype(g.scalar_type());
  at::Tensor grad_x = at::empty({a.rows, a.channels}, options);
  at::Tensor grad_mean = at::empty({a.rows, a.channels}, options);
  at::Tensor grad_std = at::empty(a.std.sizes(), options);
  if (a.rows == 0) return {grad_x, grad_mean, grad_std};
  if (a.channels == 0) return {grad_x, grad_mean, grad_std.zero_()};  // a sum over no channels
  const int lanes = cuda::lanes_per_row(a.channels);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "gaussian_logprob_bwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    bwd_kernel<scalar_t, acc_t><<<cuda::row_blocks(a.rows, lanes), kRowBlock, 0, stream>>>(
        g.data_ptr<acc_t>(), a.x.data_ptr<scalar_t>(), a.mean.data_ptr<scalar_t>(), a.std.data_ptr<scalar_t>(),
        grad_x.data_ptr<acc_t>(), grad_mean.data_ptr<acc_t>(), grad_std.data_ptr<acc_t>(), a.rows, a.channels,
        a.per_row_std, int(a.reduce), lanes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_x, grad_mean, grad_std};
}

}  // namespace
}  // namespace margrpo::gaussian

TORCH_LIBRARY_IMPL(margrpo, CUDA, m) {
  m.impl("gaussian_logprob_fwd", &margrpo::gaussian::fwd_cuda);
  m.impl("gaussian_logprob_bwd", &margrpo::gaussian::bwd_cuda);
}
