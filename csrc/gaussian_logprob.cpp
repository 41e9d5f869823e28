// gaussian_logprob_fwd / _bwd on the CPU: one pass over rows [R, C], rows split across threads,
// vectorised loops over channels, fp32 (fp64) accumulation.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_math.h"
#include "gaussian_logprob.h"

namespace margrpo::gaussian {
namespace {

// rows per parallel task: about 16k elements, so small calls stay on one thread
int64_t grain(int64_t channels) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(channels, 1)); }

// Rows [begin, end) of the forward. kStore: write the C elements of each row (reduce none);
// otherwise write the row's sum (or mean). Inner loops run over contiguous channels under
// `omp simd`, with the polynomial log of cpu_math.h; a row whose std is not a normal positive float
// takes the exact loop (std::log, NaN where std <= 0).
template <bool kStore, typename scalar_t, typename acc_t>
void fwd_rows(const Args& a, acc_t* out, int64_t begin, int64_t end) {
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const scalar_t* mean = a.mean.data_ptr<scalar_t>();
  const scalar_t* std = a.std.data_ptr<scalar_t>();
  const int64_t C = a.channels;
  const acc_t log_sqrt_2pi = acc_t(kLogSqrt2Pi);
  const acc_t nan = std::numeric_limits<acc_t>::quiet_NaN();
  for (int64_t r = begin; r < end; ++r) {
    const scalar_t* xr = x + r * C;
    const scalar_t* mr = mean + r * C;
    acc_t* out_r = out + r * C;
    acc_t total = 0;
    if (a.per_row_std) {
      // one std for the row: its log term is computed once (NaN when std <= 0, as in the reference)
      const acc_t s = acc_t(std[r]);
      const acc_t shift = s > 0 ? std::log(s) + log_sqrt_2pi : nan;
#pragma omp simd reduction(+ : total)
      for (int64_t c = 0; c < C; ++c) {
        const acc_t z = (acc_t(xr[c]) - acc_t(mr[c])) / s;
        const acc_t quad = acc_t(-0.5) * z * z;
        if constexpr (kStore) out_r[c] = quad - shift;
        total += quad;
      }
      total = C > 0 ? total - acc_t(C) * shift : acc_t(0);
    } else {
      const scalar_t* sr = std + r * C;
      int fast = 1;
#pragma omp simd reduction(& : fast)
      for (int64_t c = 0; c < C; ++c) fast &= int(cpu::log_fast_valid(acc_t(sr[c])));
      if (fast) {
#pragma omp simd reduction(+ : total)
        for (int64_t c = 0; c < C; ++c) {
          const acc_t s = acc_t(sr[c]);
          const acc_t z = (acc_t(xr[c]) - acc_t(mr[c])) / s;
          const acc_t elem = acc_t(-0.5) * z * z - cpu::log_fast(s) - log_sqrt_2pi;
          if constexpr (kStore) out_r[c] = elem;
          total += elem;
        }
      } else {
        for (int64_t c = 0; c < C; ++c) {
          const acc_t s = acc_t(sr[c]);
          const acc_t z = (acc_t(xr[c]) - acc_t(mr[c])) / s;
          const acc_t elem = s > 0 ? acc_t(-0.5) * z * z - std::log(s) - log_sqrt_2pi : nan;
          if constexpr (kStore) out_r[c] = elem;
          total += elem;
        }
      }
    }
    if constexpr (!kStore) out[r] = a.reduce == kMean ? total / acc_t(C) : total;
  }
}

template <typename scalar_t, typename acc_t>
void fwd_kernel(const Args& a, acc_t* out) {
  at::parallel_for(0, a.rows, grain(a.channels), [&](int64_t begin, int64_t end) {
    if (a.reduce == kNone) {
      fwd_rows<true, scalar_t, acc_t>(a, out, begin, end);
    } else {
      fwd_rows<false, scalar_t, acc_t>(a, out, begin, end);
    }
  });
}

template <typename scalar_t, typename acc_t>
void bwd_kernel(const Args& a, const acc_t* grad_out, acc_t* grad_x, acc_t* grad_mean, acc_t* grad_std) {
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const scalar_t* mean = a.mean.data_ptr<scalar_t>();
  const scalar_t* std = a.std.data_ptr<scalar_t>();
  const int64_t C = a.channels;
  // a per-row std of a single-channel row is the per-element case: no sum over channels
  const bool sum_std = a.per_row_std && C != 1;
  at::parallel_for(0, a.rows, grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      acc_t ge_row = 0;
      if (a.reduce != kNone) ge_row = a.reduce == kMean ? grad_out[r] / acc_t(C) : grad_out[r];
      acc_t std_sum = 0;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = r * C + c;
        const acc_t ge = a.reduce == kNone ? grad_out[i] : ge_row;
        const acc_t s = acc_t(a.per_row_std ? std[r] : std[i]);
        const acc_t diff = acc_t(x[i]) - acc_t(mean[i]);
        const acc_t inv_var = acc_t(1) / (s * s);
        const acc_t gx = -ge * diff * inv_var;
        const acc_t gs = ge * (diff * diff * inv_var - acc_t(1)) / s;
        grad_x[i] = gx;
        grad_mean[i] = -gx;
        if (sum_std) {
          std_sum += gs;
        } else {
          grad_std[i] = gs;
        }
      }
      if (sum_std) grad_std[r] = std_sum;
    }
  });
}

at::Tensor fwd_cpu(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, int64_t reduce) {
  const Args a = prepare("gaussian_logprob_fwd", x, mean, std, reduce);
  const auto out_dtype = acc_dtype(a.x.scalar_type());
  at::Tensor out = a.reduce == kNone ? at::empty({a.rows, a.channels}, a.x.options().dtype(out_dtype))
                                     : at::empty({a.rows}, a.x.options().dtype(out_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "gaussian_logprob_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    fwd_kernel<scalar_t, acc_t>(a, out.data_ptr<acc_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                                                       const at::Tensor& mean, const at::Tensor& std,
                                                       int64_t reduce) {
  const char* op = "gaussian_logprob_bwd";
  const Args a = prepare(op, x, mean, std, reduce);
  const at::Tensor g = prepare_grad(op, grad_out, a);
  const auto options = a.x.options().dtype(g.scalar_type());
  at::Tensor grad_x = at::empty({a.rows, a.channels}, options);
  at::Tensor grad_mean = at::empty({a.rows, a.channels}, options);
  at::Tensor grad_std = at::empty(a.std.sizes(), options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "gaussian_logprob_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    bwd_kernel<scalar_t, acc_t>(a, g.data_ptr<acc_t>(), grad_x.data_ptr<acc_t>(), grad_mean.data_ptr<acc_t>(),
                                grad_std.data_ptr<acc_t>());
  });
  return {grad_x, grad_mean, grad_std};
}

}  // namespace
}  // namespace margrpo::gaussian

TORCH_LIBRARY_FRAGMENT(margrpo, m) {
  m.def("gaussian_logprob_fwd(Tensor x, Tensor mean, Tensor std, int reduce) -> Tensor");
  m.def(
      "gaussian_logprob_bwd(Tensor grad_out, Tensor x, Tensor mean, Tensor std, int reduce) -> (Tensor, Tensor, "
      "Tensor)");
}

TORCH_LIBRARY_IMPL(margrpo, CPU, m) {
  m.impl("gaussian_logprob_fwd", &margrpo::gaussian::fwd_cpu);
  m.impl("gaussian_logprob_bwd", &margrpo::gaussian::bwd_cpu);
}
