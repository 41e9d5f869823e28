// topk_indices_fwd / topk_mask_fwd: arguments shared by the CPU and CUDA kernels.
// scores [B, N] -> the k largest per row; equal scores are chosen (and ordered) toward the lower index.
#pragma once

#include "common.h"

namespace margrpo::topk {

inline at::Tensor prepare(const char* op, const at::Tensor& scores, int64_t k) {
  check_floating(op, "scores", scores);
  check_dim(op, "scores", scores, 2, "[B, N]");
  const int64_t n = scores.size(1);
  TORCH_CHECK(k >= 0 && k <= n, op, ": k must be in [0, N] = [0, ", n, "] for scores of shape ", scores.sizes(),
              ", got k = ", k);
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(), op, ": rows of at most 2^31 - 1 scores are supported, got N = ",
              n);
  return scores.contiguous();
}

}  // namespace margrpo::topk
