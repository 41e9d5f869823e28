// consistency_mask_fwd on CUDA: one pass, a group of adjacent lanes per row (coalesced across rows
// of C = 16), five fused sums reduced by warp shuffles.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "consistency.h"
#include "cuda_utils.cuh"

namespace margrpo::consistency {
namespace {

using cuda::group_sum;
using cuda::kRowBlock;

template <typename scalar_t, typename acc_t>
__global__ void fwd_kernel(const scalar_t* __restrict__ prev, const scalar_t* __restrict__ cur,
                           const scalar_t* __restrict__ fin, bool* __restrict__ out, int64_t M, int64_t C,
                           acc_t threshold, int lanes) {
  const int rows_per_block = kRowBlock / lanes;
  const int lane = threadIdx.x % lanes;
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < M; first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t m = first + threadIdx.x / lanes;
    acc_t cur_fin = 0, prev_fin = 0, cur2 = 0, prev2 = 0, fin2 = 0;
    if (m < M) {
      for (int64_t c = lane; c < C; c += lanes) {
        const int64_t i = m * C + c;
        const acc_t p = acc_t(prev[i]), q = acc_t(cur[i]), f = acc_t(fin[i]);
        cur_fin += q * f;
        prev_fin += p * f;
        cur2 += q * q;
        prev2 += p * p;
        fin2 += f * f;
      }
    }
    // uniform loop bound: every lane of the warp reaches the shuffles
    cur_fin = group_sum(cur_fin, lanes);
    prev_fin = group_sum(prev_fin, lanes);
    cur2 = group_sum(cur2, lanes);
    prev2 = group_sum(prev2, lanes);
    fin2 = group_sum(fin2, lanes);
    if (m < M && lane == 0) {
      out[m] = cosine_or_zero(cur_fin, cur2, fin2) - cosine_or_zero(prev_fin, prev2, fin2) > threshold;
    }
  }
}

at::Tensor fwd_cuda(const at::Tensor& prev_in, const at::Tensor& cur_in, const at::Tensor& final_in,
                    double threshold) {
  const Args a = prepare("consistency_mask_fwd", prev_in, cur_in, final_in);
  const c10::cuda::CUDAGuard guard(a.cur.device());
  const int64_t M = a.cur.size(0), C = a.cur.size(1);
  at::Tensor out = at::empty({M}, a.cur.options().dtype(at::kBool));
  if (M == 0) return out;
  const int lanes = cuda::lanes_per_row(C);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.cur.scalar_type(), "consistency_mask_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    fwd_kernel<scalar_t, acc_t><<<cuda::row_blocks(M, lanes), kRowBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.prev.data_ptr<scalar_t>(), a.cur.data_ptr<scalar_t>(), a.final.data_ptr<scalar_t>(), out.data_ptr<bool>(),
        M, C, acc_t(threshold), lanes);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace
}  // namespace margrpo::consistency

TORCH_LIBRARY_IMPL(margrpo, CUDA, m) { m.impl("consistency_mask_fwd", &margrpo::consistency::fwd_cuda); }
