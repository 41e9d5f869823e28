// grpo_surrogate_fwd on the CPU. Deterministic two-stage reduction: the [T, B, L] terms are cut into
// chunks of whole rows whose size depends only on L (never on the thread count); each chunk sums its
// terms in index order into its own slot, then the slots are combined in chunk order.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "cpu_math.h"
#include "grpo_surrogate.h"

namespace margrpo::grpo {
namespace {

constexpr int64_t kChunkTerms = 8192;  // terms per chunk (rounded up to whole rows of L)

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& logp_in, const at::Tensor& old_in,
                                                       const at::Tensor& adv_in, const at::Tensor& weights_in,
                                                       const at::Tensor& mte_in, double clip_low, double clip_high) {
  const Args a = prepare("grpo_surrogate_fwd", logp_in, old_in, adv_in, weights_in, mte_in);
  const int64_t T = a.T, B = a.B, L = a.L;
  const auto options = a.logp.options().dtype(a.advantages.scalar_type());
  at::Tensor grad = at::empty({T, B, L}, options);
  at::Tensor loss = at::empty({}, options);
  at::Tensor stats = at::empty({4}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.logp.scalar_type(), "grpo_surrogate_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* logp = a.logp.data_ptr<scalar_t>();
    const scalar_t* old = a.old_logp.data_ptr<scalar_t>();
    const acc_t* adv = a.advantages.data_ptr<acc_t>();
    const acc_t* weights = a.weights.data_ptr<acc_t>();
    const bool* mte = a.mte_mask.data_ptr<bool>();
    acc_t* g = grad.data_ptr<acc_t>();
    const Clip<acc_t> clip(clip_low, clip_high, T);

    const int64_t rows = T * B;
    const int64_t rows_per_chunk = std::max<int64_t>(1, (kChunkTerms + L - 1) / std::max<int64_t>(L, 1));
    const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<acc_t> partial(chunks * kSlots);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        // ratio > 0 always: a max still at -1 at the end means no term was kept
        acc_t loss_sum = 0, clipped = 0, kl = 0, ratio_sum = 0, ratio_max = -1;
        const int64_t row_end = std::min(rows, (chunk + 1) * rows_per_chunk);
        for (int64_t row = chunk * rows_per_chunk; row < row_end; ++row) {
          const int64_t t = row / B, b = row % B;
          const scalar_t* lp = logp + row * L;
          const scalar_t* op = old + row * L;
          const acc_t* wb = weights + b * L;
          const bool* mb = mte + b * L;
          acc_t* gr = g + row * L;
          const acc_t adv_b = adv[b];
#pragma omp simd reduction(+ : loss_sum, clipped, kl, ratio_sum) reduction(max : ratio_max)
          for (int64_t l = 0; l < L; ++l) {
            const acc_t log_ratio = clamped_log_ratio(acc_t(lp[l]), acc_t(op[l]));
            const acc_t w = term_weight(wb[l], mb[l], t == 0, clip);
            const Term<acc_t> e = term(log_ratio, cpu::exp_fast(log_ratio), adv_b, w, clip);
            gr[l] = e.grad;
            loss_sum += e.loss;
            clipped += e.clipped;
            kl += e.kl;
            ratio_sum += e.ratio;
            ratio_max = std::max(ratio_max, e.kept_ratio);
          }
        }
        acc_t* slots = partial.data() + chunk * kSlots;
        slots[kLoss] = loss_sum;
        slots[kClipFraction] = clipped;
        slots[kApproxKl] = kl;
        slots[kRatioMean] = ratio_sum;
        slots[kRatioMax] = ratio_max;
      }
    });
    acc_t total[kSlots] = {0, 0, 0, -1, 0};
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const acc_t* slots = partial.data() + chunk * kSlots;
      for (int s : {kLoss, kClipFraction, kApproxKl, kRatioMean}) total[s] += slots[s];
      total[kRatioMax] = std::max(total[kRatioMax], slots[kRatioMax]);
    }
    if (total[kRatioMax] < acc_t(0)) total[kRatioMax] = acc_t(1);  // no kept term
    loss.fill_(total[kLoss]);
    acc_t* st = stats.data_ptr<acc_t>();
    for (int s = 0; s < 4; ++s) st[s] = total[s];
  });
  return {loss, stats, grad};
}

}  // namespace
}  // namespace margrpo::grpo

TORCH_LIBRARY_FRAGMENT(margrpo, m) {
  m.def(
      "grpo_surrogate_fwd(Tensor logp, Tensor old_logp, Tensor advantages, Tensor weights, Tensor mte_mask, "
      "float clip_low, float clip_high) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(margrpo, CPU, m) { m.impl("grpo_surrogate_fwd", &margrpo::grpo::fwd_cpu); }
