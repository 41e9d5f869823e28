// consistency_mask_fwd: arguments shared by the CPU and CUDA kernels.
// prev, cur, final [M, C] -> bool [M]: cos(cur, final) - cos(prev, final) > threshold, where the cosine
// of a zero-norm vector is 0.
#pragma once

#include "common.h"

namespace margrpo::consistency {

struct Args {
  at::Tensor prev, cur, final;
};

inline Args prepare(const char* op, at::Tensor prev, at::Tensor cur, at::Tensor final) {
  check_floating(op, "prev", prev);
  check_floating(op, "cur", cur);
  check_floating(op, "final", final);
  check_dim(op, "cur", cur, 2, "[M, C]");
  check_shape(op, "prev", prev, cur.sizes(), "cur");
  check_shape(op, "final", final, cur.sizes(), "cur");
  check_same_device(op, "prev", prev, cur, "cur");
  check_same_device(op, "final", final, cur, "cur");
  unify_dtype({&cur, &prev, &final});  // the reference computes in the accumulation dtype of cur
  return {prev.contiguous(), cur.contiguous(), final.contiguous()};
}

// Cosine from its three sums, exactly as margrpo.ops.reference.cosine_or_zero: 0 for a zero norm.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t cosine_or_zero(acc_t dot, acc_t norm_a2, acc_t norm_b2) {
  const acc_t norm2 = norm_a2 * norm_b2;
  const acc_t tiny = std::numeric_limits<acc_t>::min();
  return norm2 > acc_t(0) ? dot / std::sqrt(norm2 > tiny ? norm2 : tiny) : acc_t(0);
}

}  // namespace margrpo::consistency
