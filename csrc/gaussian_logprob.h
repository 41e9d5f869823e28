// gaussian_logprob_fwd / _bwd: arguments shared by the CPU (gaussian_logprob.cpp) and CUDA
// (gaussian_logprob_cuda.cu) kernels. Semantics: margrpo/ops/reference.py.
#pragma once

#include "common.h"

namespace margrpo::gaussian {

enum Reduce : int64_t { kNone = 0, kSum = 1, kMean = 2 };
constexpr double kLogSqrt2Pi = 0.918938533204672741780329736406;  // 0.5 * log(2 pi)

#if defined(__CUDACC__)
#define MARGRPO_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MARGRPO_HOST_DEVICE inline
#endif

// One element's backward, shared by the CPU and CUDA kernels: with d = x - mean and upstream
// gradient ge, d/dx = -ge d / s^2 (d/dmean is its negative) and d/ds = ge (d^2 / s^2 - 1) / s.
template <typename acc_t>
MARGRPO_HOST_DEVICE void element_grads(acc_t ge, acc_t diff, acc_t s, acc_t& grad_x, acc_t& grad_std) {
  const acc_t inv_var = acc_t(1) / (s * s);
  grad_x = -ge * diff * inv_var;
  grad_std = ge * (diff * diff * inv_var - acc_t(1)) / s;
}

// Checked, contiguous operands of one call: x, mean [R, C]; std [R, S] with S in {1, C}.
struct Args {
  at::Tensor x, mean, std;
  int64_t rows, channels;
  bool per_row_std;
  Reduce reduce;
};

inline Args prepare(const char* op, at::Tensor x, at::Tensor mean, at::Tensor std, int64_t reduce) {
  check_floating(op, "x", x);
  check_floating(op, "mean", mean);
  check_floating(op, "std", std);
  check_dim(op, "x", x, 2, "[R, C]");
  check_shape(op, "mean", mean, x.sizes(), "x");
  check_dim(op, "std", std, 2, "[R, 1] or [R, C]");
  const int64_t rows = x.size(0), channels = x.size(1);
  TORCH_CHECK(std.size(0) == rows && (std.size(1) == 1 || std.size(1) == channels), op,
              ": std must be [R, 1] or [R, C] = [", rows, ", 1] or [", rows, ", ", channels, "], got ",
              std.sizes());
  TORCH_CHECK(reduce == kNone || reduce == kSum || reduce == kMean, op,
              ": reduce must be 0 (none), 1 (sum) or 2 (mean), got ", reduce);
  check_same_device(op, "mean", mean, x, "x");
  check_same_device(op, "std", std, x, "x");
  unify_dtype({&x, &mean, &std});
  const bool per_row = std.size(1) == 1;
  return {x.contiguous(), mean.contiguous(), std.contiguous(), rows, channels, per_row, Reduce(reduce)};
}

// grad_out of the backward: [R, C] for reduce none, [R] otherwise; cast to the accumulation dtype.
inline at::Tensor prepare_grad(const char* op, const at::Tensor& grad_out, const Args& a) {
  check_floating(op, "grad_out", grad_out);
  check_same_device(op, "grad_out", grad_out, a.x, "x");
  if (a.reduce == kNone) {
    check_shape(op, "grad_out", grad_out, a.x.sizes(), "x (reduce none)");
  } else {
    TORCH_CHECK(grad_out.dim() == 1 && grad_out.size(0) == a.rows, op, ": grad_out must be [R] = [", a.rows,
                "] for reduce sum/mean, got shape ", grad_out.sizes());
  }
  return grad_out.to(acc_dtype(a.x.scalar_type())).contiguous();
}

}  // namespace margrpo::gaussian
