// grpo_surrogate_fwd: arguments and the per-term math shared by the CPU and CUDA kernels.
// The clipped PPO/GRPO objective, its gradient w.r.t. logp and four statistics in one pass; see
// margrpo/ops/reference.py for the contract.
#pragma once

#include "common.h"

namespace margrpo::grpo {

constexpr double kMaxLogRatio = 20.0;  // log-ratios are clamped to +-20 before exp (no overflow to inf)

// Order of the statistics in the stats output; kLoss is an internal slot of the partial sums.
enum Slot { kClipFraction = 0, kApproxKl = 1, kRatioMean = 2, kRatioMax = 3, kLoss = 4, kSlots = 5 };

// Initial value of a slot: 0 for the sums; -1 for the ratio max (ratio > 0, so a max still at -1 at
// the end means that no term was kept, and the statistic is reported as 1).
template <typename acc_t>
C10_HOST_DEVICE inline acc_t initial(int slot) {
  return slot == kRatioMax ? acc_t(-1) : acc_t(0);
}

// max(a, b), NaN when either is, like torch.max: a NaN ratio must show in ratio_max, and a plain
// `b > a ? b : a` drops a NaN b.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t max_keep_nan(acc_t a, acc_t b) {
  return a != a || a > b ? a : b;
}

struct Args {
  at::Tensor logp, old_logp, advantages, weights, mte_mask;
  int64_t T, B, L;
};

inline Args prepare(const char* op, at::Tensor logp, at::Tensor old_logp, const at::Tensor& advantages,
                    const at::Tensor& weights, const at::Tensor& mte_mask) {
  check_floating(op, "logp", logp);
  check_floating(op, "old_logp", old_logp);
  check_floating(op, "advantages", advantages);
  check_floating(op, "weights", weights);
  check_dim(op, "logp", logp, 3, "[T, B, L]");
  check_shape(op, "old_logp", old_logp, logp.sizes(), "logp");
  const int64_t T = logp.size(0), B = logp.size(1), L = logp.size(2);
  TORCH_CHECK(advantages.dim() == 1 && advantages.size(0) == B, op, ": advantages must be [B] = [", B,
              "], got shape ", advantages.sizes());
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) == B && weights.size(1) == L, op, ": weights must be [B, L] = [",
              B, ", ", L, "], got shape ", weights.sizes());
  TORCH_CHECK(mte_mask.dim() == 2 && mte_mask.size(0) == B && mte_mask.size(1) == L, op,
              ": mte_mask must be [B, L] = [", B, ", ", L, "], got shape ", mte_mask.sizes());
  TORCH_CHECK(mte_mask.scalar_type() == at::kBool, op, ": mte_mask must be a bool tensor, got ",
              mte_mask.scalar_type());
  check_same_device(op, "old_logp", old_logp, logp, "logp");
  check_same_device(op, "advantages", advantages, logp, "logp");
  check_same_device(op, "weights", weights, logp, "logp");
  check_same_device(op, "mte_mask", mte_mask, logp, "logp");
  const at::ScalarType acc = acc_dtype(logp.scalar_type());  // the reference's dtype, from logp alone
  unify_dtype({&logp, &old_logp});
  return {logp.contiguous(), old_logp.contiguous(), advantages.to(acc).contiguous(), weights.to(acc).contiguous(),
          mte_mask.contiguous(), T, B, L};
}

// Constants of one call, in the accumulation dtype (torch casts Python scalars to the tensor dtype).
template <typename acc_t>
struct Clip {
  acc_t low, high, inv_T;  // ratio range [1 - clip_low, 1 + clip_high]; the MTE weight 1/T
  Clip(double clip_low, double clip_high, int64_t T)
      : low(acc_t(1.0 - clip_low)), high(acc_t(1.0 + clip_high)), inv_T(acc_t(1.0 / double(T))) {}
};

// The log-ratio, clamped to +-kMaxLogRatio (NaN stays NaN); the caller takes its exp.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t clamped_log_ratio(acc_t logp, acc_t old_logp) {
  const acc_t max_lr = acc_t(kMaxLogRatio);
  const acc_t log_ratio = logp - old_logp;
  return log_ratio < -max_lr ? -max_lr : (log_ratio > max_lr ? max_lr : log_ratio);
}

// The weight of a term: weights[b, l] times 1/T on MTE tokens, else `rest` (1 for trajectory 0, 0 for
// the others). Plain values, no struct members: a load in one branch of a select would keep the CPU
// loop from vectorising.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t term_weight(acc_t token_weight, bool mte, acc_t inv_T, acc_t rest) {
  return token_weight * (mte ? inv_T : rest);
}

// What one (trajectory, token) term adds to the loss and statistics, and d loss / d logp.
template <typename acc_t>
struct Term {
  acc_t grad, loss, clipped, kl, ratio, kept_ratio;  // kept_ratio: the ratio if w > 0, else -1
};

// ratio = exp(log_ratio), w the term's weight, [low, high] the ratio's clip range.
template <typename acc_t>
C10_HOST_DEVICE inline Term<acc_t> term(acc_t log_ratio, acc_t ratio, acc_t adv, acc_t w, acc_t low, acc_t high) {
  const acc_t clamped = ratio < low ? low : (ratio > high ? high : ratio);
  const acc_t unclipped = -adv * ratio;
  const acc_t clipped = -adv * clamped;
  const bool is_clipped = clipped > unclipped;  // the gradient is zero where the clipped branch wins
  return {is_clipped ? acc_t(0) : w * unclipped,
          w * (is_clipped ? clipped : unclipped),
          is_clipped ? w : acc_t(0),
          w * (ratio - acc_t(1) - log_ratio),
          w * ratio,
          w > acc_t(0) ? ratio : acc_t(-1)};
}

}  // namespace margrpo::grpo
