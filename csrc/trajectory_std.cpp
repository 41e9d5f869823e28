// trajectory_std_fwd / _bwd on the CPU. Rows m are split across threads and processed in blocks of
// whole rows: for every element of a block, the shifted two-pass mean and variance over the K
// trajectories (see tile_moments), in tiles of contiguous elements reduced in vector registers.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "cpu_math.h"
#include "trajectory_std.h"

namespace margrpo::trajectory_std {
namespace {

constexpr int64_t kBlockElements = 1024;

int64_t grain(int64_t K, int64_t C) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(K * C, 1)); }

int64_t block_rows(int64_t C) { return std::max<int64_t>(1, kBlockElements / std::max<int64_t>(C, 1)); }

constexpr int kTile = 64;  // elements whose K samples are reduced together, in registers

// Two-pass moments over K of `width` (<= kTile) consecutive elements, `p` pointing at trajectory 0
// of a [K, MC] tensor, shifted by trajectory 0's value: latents with a large offset and a small
// spread (1e5 and 1e-2) would otherwise lose the spread to the rounding of the mean (relative error
// 0.2 in fp32). The differences from the shift are exact for nearby values (Sterbenz), so the error
// scales with the spread, not the offset. Writes the shift, the mean of the differences from it, and
// the population std. kWidth > 0 fixes the width at compile time, which lets the compiler keep the
// tile's accumulators in vector registers (twice as fast as a runtime width).
template <int kWidth, typename scalar_t, typename acc_t>
inline void tile_moments(const scalar_t* p, int64_t K, int64_t MC, int width, acc_t* shift, acc_t* mean, acc_t* std) {
  const int w = kWidth > 0 ? kWidth : width;
  acc_t s[kTile], m[kTile] = {}, v[kTile] = {};
  for (int j = 0; j < w; ++j) s[j] = acc_t(p[j]);
  for (int64_t k = 1; k < K; ++k) {
    for (int j = 0; j < w; ++j) m[j] += acc_t(p[k * MC + j]) - s[j];
  }
  for (int j = 0; j < w; ++j) m[j] /= acc_t(K);
  for (int64_t k = 0; k < K; ++k) {
    for (int j = 0; j < w; ++j) {
      const acc_t d = (acc_t(p[k * MC + j]) - s[j]) - m[j];
      v[j] += d * d;
    }
  }
  for (int j = 0; j < w; ++j) {
    shift[j] = s[j];
    mean[j] = m[j];
    std[j] = std::sqrt(v[j] / acc_t(K));
  }
}

// Shift, mean and population std over K (as tile_moments) of the n elements starting at `offset` of
// a [K, MC] tensor.
template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void moments(const scalar_t* samples, int64_t K, int64_t MC, int64_t offset, int64_t n, acc_t* shift,
                                acc_t* mean, acc_t* std) {
  int64_t i = 0;
  for (; i + kTile <= n; i += kTile) {
    tile_moments<kTile, scalar_t, acc_t>(samples + offset + i, K, MC, kTile, shift + i, mean + i, std + i);
  }
  if (i < n) {
    tile_moments<0, scalar_t, acc_t>(samples + offset + i, K, MC, int(n - i), shift + i, mean + i, std + i);
  }
}

template <typename scalar_t, typename acc_t>
void fwd_rows(const scalar_t* samples, acc_t* out, int64_t K, int64_t M, int64_t C, int64_t begin, int64_t end) {
  const int64_t rows_per_block = block_rows(C);
  std::vector<acc_t> shift(rows_per_block * C), mean(rows_per_block * C), std(rows_per_block * C);
  const acc_t inv_C = acc_t(1) / acc_t(C);  // C == 0: 0 * inf = NaN, the mean over no channels
  for (int64_t m0 = begin; m0 < end; m0 += rows_per_block) {
    const int64_t rows = std::min(rows_per_block, end - m0);
    moments<scalar_t, acc_t>(samples, K, M * C, m0 * C, rows * C, shift.data(), mean.data(), std.data());
    cpu::row_sums(std.data(), rows, C, inv_C, out + m0);
  }
}

template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void bwd_rows(const acc_t* grad_out, const scalar_t* samples, acc_t* grad, int64_t K, int64_t M,
                                 int64_t C, int64_t begin, int64_t end) {
  const int64_t rows_per_block = block_rows(C);
  std::vector<acc_t> shift(rows_per_block * C), mean(rows_per_block * C), std(rows_per_block * C);
  const int64_t MC = M * C;
  for (int64_t m0 = begin; m0 < end; m0 += rows_per_block) {
    const int64_t rows = std::min(rows_per_block, end - m0), n = rows * C, offset = m0 * C;
    moments<scalar_t, acc_t>(samples, K, MC, offset, n, shift.data(), mean.data(), std.data());
    // d std / d sample = (sample - mean) / (K std), times grad_out / C; 0 where the std is 0.
    // sample - mean is taken as (sample - shift) - mean, as in tile_moments.
    // The std buffer becomes that per-element scale.
    for (int64_t r = 0; r < rows; ++r) {
      const acc_t row_grad = grad_out[m0 + r] / acc_t(C);
      acc_t* s = std.data() + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) s[c] = s[c] > 0 ? row_grad / (acc_t(K) * s[c]) : acc_t(0);
    }
    for (int64_t k = 0; k < K; ++k) {
      const scalar_t* p = samples + k * MC + offset;
      acc_t* q = grad + k * MC + offset;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) q[i] = ((acc_t(p[i]) - shift[i]) - mean[i]) * std[i];
    }
  }
}

at::Tensor fwd_cpu(const at::Tensor& samples_in) {
  const at::Tensor samples = prepare("trajectory_std_fwd", samples_in);
  const int64_t K = samples.size(0), M = samples.size(1), C = samples.size(2);
  at::Tensor out = at::empty({M}, samples.options().dtype(acc_dtype(samples.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, samples.scalar_type(), "trajectory_std_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    at::parallel_for(0, M, grain(K, C), [&](int64_t begin, int64_t end) {
      fwd_rows<scalar_t, acc_t>(samples.data_ptr<scalar_t>(), out.data_ptr<acc_t>(), K, M, C, begin, end);
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
    at::parallel_for(0, M, grain(K, C), [&](int64_t begin, int64_t end) {
      bwd_rows<scalar_t, acc_t>(g.data_ptr<acc_t>(), samples.data_ptr<scalar_t>(), grad.data_ptr<acc_t>(), K, M, C,
                                begin, end);
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
