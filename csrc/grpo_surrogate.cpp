// grpo_surrogate_fwd on the CPU. Deterministic two-stage reduction: the [T, B, L] terms are cut into
// chunks of whole rows whose size depends only on L (never on the thread count); each chunk sums its
// terms into its own slots (vectorised over each row), then the slots are combined in chunk order.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "cpu_math.h"
#include "grpo_surrogate.h"

namespace margrpo::grpo {
namespace {

constexpr int64_t kChunkTerms = 8192;  // terms per chunk (rounded up to whole rows of L)

// One row of L terms (one trajectory t, one sample b): the gradients into g and each term's five
// contributions into parts[slot * L + l], as one elementwise loop. The sums are separate loops: GCC
// leaves a loop with several reductions unvectorised in the target clones. The body reads only plain
// arrays and scalar arguments (a struct member or bool read in one branch of a select would also
// keep it scalar).
template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void row_terms(const scalar_t* logp, const scalar_t* old, const acc_t* weights, const uint8_t* mte,
                                  acc_t adv, acc_t rest, acc_t inv_T, acc_t low, acc_t high, int64_t L, acc_t* g,
                                  acc_t* parts) {
#pragma omp simd
  for (int64_t l = 0; l < L; ++l) {
    const acc_t log_ratio = clamped_log_ratio(acc_t(logp[l]), acc_t(old[l]));
    const acc_t w = term_weight(weights[l], mte[l] != 0, inv_T, rest);
    const Term<acc_t> e = term(log_ratio, cpu::exp_fast(log_ratio), adv, w, low, high);
    g[l] = e.grad;
    parts[kLoss * L + l] = e.loss;
    parts[kClipFraction * L + l] = e.clipped;
    parts[kApproxKl * L + l] = e.kl;
    parts[kRatioMean * L + l] = e.ratio;
    parts[kRatioMax * L + l] = e.kept_ratio;
  }
}

template <typename acc_t>
MARGRPO_CPU_CLONES acc_t sum(const acc_t* x, int64_t n) {
  acc_t total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += x[i];
  return total;
}

// max(init, x[0, n)), NaN when any of them is (max_keep_nan). The simd max reduction drops NaN, so a
// second loop looks for one: one reduction per loop keeps both vectorised.
template <typename acc_t>
MARGRPO_CPU_CLONES acc_t maximum(const acc_t* x, int64_t n, acc_t init) {
  acc_t result = init;
#pragma omp simd reduction(max : result)
  for (int64_t i = 0; i < n; ++i) result = x[i] > result ? x[i] : result;  // std::max takes references: no simd
  int nan = 0;
#pragma omp simd reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) nan |= x[i] != x[i];
  return nan ? std::numeric_limits<acc_t>::quiet_NaN() : max_keep_nan(init, result);
}

// Rows [row_begin, row_end) of the [T * B, L] terms: their gradients, and their five sums into slots.
template <typename scalar_t, typename acc_t>
void chunk_terms(const Args& a, const Clip<acc_t>& clip, int64_t row_begin, int64_t row_end, acc_t* grad,
                 acc_t* slots) {
  const int64_t B = a.B, L = a.L;
  std::vector<acc_t> parts(kSlots * L);
  for (int s = 0; s < kSlots; ++s) slots[s] = initial<acc_t>(s);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row % B;
    const acc_t rest = row < B ? acc_t(1) : acc_t(0);  // trajectory 0 counts outside MTE tokens
    row_terms<scalar_t, acc_t>(a.logp.data_ptr<scalar_t>() + row * L, a.old_logp.data_ptr<scalar_t>() + row * L,
                               a.weights.data_ptr<acc_t>() + b * L,
                               reinterpret_cast<const uint8_t*>(a.mte_mask.data_ptr<bool>()) + b * L,
                               a.advantages.data_ptr<acc_t>()[b], rest, clip.inv_T, clip.low, clip.high, L,
                               grad + row * L, parts.data());
    for (int s : {kLoss, kClipFraction, kApproxKl, kRatioMean}) slots[s] += sum(parts.data() + s * L, L);
    slots[kRatioMax] = maximum(parts.data() + kRatioMax * L, L, slots[kRatioMax]);
  }
}

template <typename scalar_t, typename acc_t>
void surrogate(const Args& a, double clip_low, double clip_high, acc_t* grad, acc_t* loss, acc_t* stats) {
  const Clip<acc_t> clip(clip_low, clip_high, a.T);
  const int64_t rows = a.T * a.B;
  const int64_t rows_per_chunk = std::max<int64_t>(1, (kChunkTerms + a.L - 1) / std::max<int64_t>(a.L, 1));
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  std::vector<acc_t> partial(chunks * kSlots);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t row_begin = chunk * rows_per_chunk;
      chunk_terms<scalar_t, acc_t>(a, clip, row_begin, std::min(rows, row_begin + rows_per_chunk), grad,
                                   partial.data() + chunk * kSlots);
    }
  });
  acc_t total[kSlots];
  for (int s = 0; s < kSlots; ++s) total[s] = initial<acc_t>(s);
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const acc_t* slots = partial.data() + chunk * kSlots;
    for (int s = 0; s < kSlots; ++s) total[s] = s == kRatioMax ? max_keep_nan(total[s], slots[s]) : total[s] + slots[s];
  }
  *loss = total[kLoss];
  for (int s : {kClipFraction, kApproxKl, kRatioMean}) stats[s] = total[s];
  stats[kRatioMax] = total[kRatioMax] < acc_t(0) ? acc_t(1) : total[kRatioMax];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fwd_cpu(const at::Tensor& logp_in, const at::Tensor& old_in,
                                                       const at::Tensor& adv_in, const at::Tensor& weights_in,
                                                       const at::Tensor& mte_in, double clip_low, double clip_high) {
  const Args a = prepare("grpo_surrogate_fwd", logp_in, old_in, adv_in, weights_in, mte_in);
  const auto options = a.logp.options().dtype(a.advantages.scalar_type());
  at::Tensor grad = at::empty({a.T, a.B, a.L}, options);
  at::Tensor loss = at::empty({}, options);
  at::Tensor stats = at::empty({4}, options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.logp.scalar_type(), "grpo_surrogate_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    surrogate<scalar_t, acc_t>(a, clip_low, clip_high, grad.data_ptr<acc_t>(), loss.data_ptr<acc_t>(),
                               stats.data_ptr<acc_t>());
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
