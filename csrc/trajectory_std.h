// trajectory_std_fwd / _bwd: arguments shared by the CPU and CUDA kernels.
// samples [K, M, C]: std over the K seed trajectories (population), then mean over the C channels.
#pragma once

#include "common.h"

namespace margrpo::trajectory_std {

inline at::Tensor prepare(const char* op, const at::Tensor& samples) {
  check_floating(op, "samples", samples);
  check_dim(op, "samples", samples, 3, "[K, M, C]");
  TORCH_CHECK(samples.size(0) >= 2, op, ": samples must hold K >= 2 trajectories along dim 0, got K = ",
              samples.size(0), " (shape ", samples.sizes(), ")");
  return samples.contiguous();
}

// grad_out [M], cast to the accumulation dtype.
inline at::Tensor prepare_grad(const char* op, const at::Tensor& grad_out, const at::Tensor& samples) {
  check_floating(op, "grad_out", grad_out);
  check_same_device(op, "grad_out", grad_out, samples, "samples");
  TORCH_CHECK(grad_out.dim() == 1 && grad_out.size(0) == samples.size(1), op, ": grad_out must be [M] = [",
              samples.size(1), "], got shape ", grad_out.sizes());
  return grad_out.to(acc_dtype(samples.scalar_type())).contiguous();
}

}  // namespace margrpo::trajectory_std
