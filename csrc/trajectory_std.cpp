// trajectory_std_fwd / _bwd on the CPU. Rows m are split across threads; for each row the K
// trajectories are read twice (mean, then centred squares: the exact two-pass variance) in tiles of
// channels kept on the stack, so the inner loops run over contiguous channels and vectorise.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "trajectory_std.h"

namespace margrpo::trajectory_std {
namespace {

constexpr int64_t kTile = 64;  // channels per stack tile

int64_t grain(int64_t K, int64_t C) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(K * C, 1)); }

// Mean and population std over K of one tile of channels [c0, c0 + n) of row m.
template <typename scalar_t, typename acc_t>
void tile_moments(const scalar_t* samples, int64_t K, int64_t MC, int64_t offset, int64_t n, acc_t* mean,
                  acc_t* std) {
  std::fill(mean, mean + n, acc_t(0));
  std::fill(std, std + n, acc_t(0));
  for (int64_t k = 0; k < K; ++k) {
    const scalar_t* p = samples + k * MC + offset;
    for (int64_t j = 0; j < n; ++j) mean[j] += acc_t(p[j]);
  }
  for (int64_t j = 0; j < n; ++j) mean[j] /= acc_t(K);
  for (int64_t k = 0; k < K; ++k) {
    const scalar_t* p = samples + k * MC + offset;
    for (int64_t j = 0; j < n; ++j) {
      const acc_t d = acc_t(p[j]) - mean[j];
      std[j] += d * d;
    }
  }
  for (int64_t j = 0; j < n; ++j) std[j] = std::sqrt(std[j] / acc_t(K));
}

at::Tensor fwd_cpu(const at::Tensor& samples_in) {
  const at::Tensor samples = prepare("trajectory_std_fwd", samples_in);
  const int64_t K = samples.size(0), M = samples.size(1), C = samples.size(2);
  at::Tensor out = at::empty({M}, samples.options().dtype(acc_dtype(samples.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, samples.scalar_type(), "trajectory_std_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* s = samples.data_ptr<scalar_t>();
    acc_t* o = out.data_ptr<acc_t>();
    at::parallel_for(0, M, grain(K, C), [&](int64_t begin, int64_t end) {
      acc_t mean[kTile], std[kTile];
      for (int64_t m = begin; m < end; ++m) {
        acc_t row = 0;
        for (int64_t c0 = 0; c0 < C; c0 += kTile) {
          const int64_t n = std::min(kTile, C - c0);
          tile_moments<scalar_t, acc_t>(s, K, M * C, m * C + c0, n, mean, std);
          for (int64_t j = 0; j < n; ++j) row += std[j];
        }
        o[m] = row / acc_t(C);  // C == 0 gives NaN, like the mean of an empty tensor
      }
    });
  });
  return out;
}

at::Tensor bwd_cpu(const at::Tensor& grad_out, const at::Tensor& samples_in) {
  const char* op = "trajectory_std_bwd";
  const at::Tensor samples = prepare(op, samples_in);
  const at::Tensor g = prepare_grad(op, grad_out, samples);
  const int64_t K = samples.size(0), M = samples.size(1), C = samples.size(2);
  at::Tensor grad = at::empty({K, M, C}, samples.options().dtype(g.scalar_type()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, samples.scalar_type(), "trajectory_std_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* s = samples.data_ptr<scalar_t>();
    const acc_t* go = g.data_ptr<acc_t>();
    acc_t* gs = grad.data_ptr<acc_t>();
    at::parallel_for(0, M, grain(K, C), [&](int64_t begin, int64_t end) {
      acc_t mean[kTile], std[kTile], scale[kTile];
      for (int64_t m = begin; m < end; ++m) {
        const acc_t row_grad = go[m] / acc_t(C);
        for (int64_t c0 = 0; c0 < C; c0 += kTile) {
          const int64_t n = std::min(kTile, C - c0);
          const int64_t offset = m * C + c0;
          tile_moments<scalar_t, acc_t>(s, K, M * C, offset, n, mean, std);
          // d std / d sample = (sample - mean) / (K std); defined as 0 where the std is 0
          for (int64_t j = 0; j < n; ++j) scale[j] = std[j] > 0 ? row_grad / (acc_t(K) * std[j]) : acc_t(0);
          for (int64_t k = 0; k < K; ++k) {
            const scalar_t* p = s + k * M * C + offset;
            acc_t* q = gs + k * M * C + offset;
            for (int64_t j = 0; j < n; ++j) q[j] = (acc_t(p[j]) - mean[j]) * scale[j];
          }
        }
      }
    });
  });
  return grad;
}

}  // namespace
}  // namespace margrpo::trajectory_std

TORCH_LIBRARY_FRAGMENT(margrpo, m) {
  m.def("trajectory_std_fwd(Tensor samples) -> Tensor");
  m.def("trajectory_std_bwd(Tensor grad_out, Tensor samples) -> Tensor");
}

TORCH_LIBRARY_IMPL(margrpo, CPU, m) {
  m.impl("trajectory_std_fwd", &margrpo::trajectory_std::fwd_cpu);
  m.impl("trajectory_std_bwd", &margrpo::trajectory_std::bwd_cpu);
}
