// grpo_surrogate_fwd on CUDA: one pass writes the gradient and reduces the loss and statistics in
// two deterministic stages. The grid size is a function of the element count only (never of the
// device), each thread walks a fixed set of elements in a fixed order, and both stages reduce in a
// fixed tree: the same inputs give the same bits on every run and every GPU model.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "cuda_utils.cuh"
#include "grpo_surrogate.h"

namespace margrpo::grpo {
namespace {

constexpr int kBlock = 256;
constexpr int kItemsPerThread = 8;  // elements per thread before the grid stops growing
constexpr int kMaxBlocks = 1024;    // stage-1 partials; stage 2 reduces them in one block

// sums add, the ratio_max slot takes the max (NaN when either is)
struct Combine {
  template <typename acc_t>
  __device__ acc_t operator()(int slot, acc_t a, acc_t b) const {
    return slot == kRatioMax ? max_keep_nan(a, b) : a + b;
  }
};

template <typename scalar_t, typename acc_t>
__global__ void terms_kernel(const scalar_t* __restrict__ logp, const scalar_t* __restrict__ old_logp,
                             const acc_t* __restrict__ advantages, const acc_t* __restrict__ weights,
                             const bool* __restrict__ mte_mask, acc_t* __restrict__ grad, acc_t* __restrict__ partials,
                             int64_t n, int64_t B, int64_t L, Clip<acc_t> clip) {
  acc_t sums[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) sums[s] = initial<acc_t>(s);
  const int64_t BL = B * L;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bl = i % BL;  // i = (t * B + b) * L + l
    const acc_t log_ratio = clamped_log_ratio(acc_t(logp[i]), acc_t(old_logp[i]));
    const acc_t w = term_weight(weights[bl], mte_mask[bl], clip.inv_T, acc_t(i < BL ? 1 : 0));
    const Term<acc_t> e = term(log_ratio, std::exp(log_ratio), advantages[bl / L], w, clip.low, clip.high);
    grad[i] = e.grad;
    sums[kLoss] += e.loss;
    sums[kClipFraction] += e.clipped;
    sums[kApproxKl] += e.kl;
    sums[kRatioMean] += e.ratio;
    sums[kRatioMax] = max_keep_nan(sums[kRatioMax], e.kept_ratio);
  }
  cuda::block_reduce(sums, Combine{});
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) partials[blockIdx.x * kSlots + s] = sums[s];
  }
}

template <typename acc_t>
__global__ void finish_kernel(const acc_t* __restrict__ partials, int blocks, acc_t* __restrict__ loss,
                              acc_t* __restrict__ stats) {
  acc_t sums[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) sums[s] = initial<acc_t>(s);
  const Combine combine;
  for (int p = threadIdx.x; p < blocks; p += blockDim.x) {
    for (int s = 0; s < kSlots; ++s) sums[s] = combine(s, sums[s], partials[p * kSlots + s]);
  }
  cuda::block_reduce(sums, combine);
  if (threadIdx.x == 0) {
    *loss = sums[kLoss];
    stats[kClipFraction] = sums[kClipFraction];
    stats[kApproxKl] = sums[kApproxKl];
    stats[kRatioMean] = sums[kRatioMean];
    stats[kRatioMax] = sums[kRatioMax] < acc_t(0) ? acc_t(1) : sums[kRatioMax];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cuda(const at::Tensor& logp_in, const at::Tensor& old_in,
                                                        const at::Tensor& adv_in, const at::Tensor& weights_in,
                                                        const at::Tensor& mte_in, double clip_low, double clip_high) {
  const Args a = prepare("grpo_surrogate_fwd", logp_in, old_in, adv_in, weights_in, mte_in);
  const c10::cuda::CUDAGuard guard(a.logp.device());
  const auto options = a.logp.options().dtype(a.advantages.scalar_type());
  at::Tensor grad = at::empty({a.T, a.B, a.L}, options);
  at::Tensor loss = at::empty({}, options);
  at::Tensor stats = at::empty({4}, options);
  const int64_t n = grad.numel();
  const int64_t per_block = int64_t(kBlock) * kItemsPerThread;
  const int blocks = int(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, kMaxBlocks));
  at::Tensor partials = at::empty({blocks, kSlots}, options);
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.logp.scalar_type(), "grpo_surrogate_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // an empty input still runs both stages: they write loss 0, stats (0, 0, 0, 1)
    terms_kernel<scalar_t, acc_t><<<blocks, kBlock, 0, stream>>>(
        a.logp.data_ptr<scalar_t>(), a.old_logp.data_ptr<scalar_t>(), a.advantages.data_ptr<acc_t>(),
        a.weights.data_ptr<acc_t>(), a.mte_mask.data_ptr<bool>(), grad.data_ptr<acc_t>(), partials.data_ptr<acc_t>(),
        n, a.B, a.L, Clip<acc_t>(clip_low, clip_high, a.T));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_kernel<acc_t><<<1, kBlock, 0, stream>>>(partials.data_ptr<acc_t>(), blocks, loss.data_ptr<acc_t>(),
                                                   stats.data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {loss, stats, grad};
}

}  // namespace
}  // namespace margrpo::grpo

TORCH_LIBRARY_IMPL(margrpo, CUDA, m) { m.impl("grpo_surrogate_fwd", &margrpo::grpo::fwd_cuda); }
