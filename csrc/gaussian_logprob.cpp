// gaussian_logprob_fwd / _bwd on the CPU: one pass over rows [R, C], rows split across threads,
// vectorised loops (CPU-specific clones, polynomial log), fp32 (fp64) accumulation.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "cpu_math.h"
#include "gaussian_logprob.h"

namespace margrpo::gaussian {
namespace {

// rows per parallel task: about 16k elements, so small calls stay on one thread
int64_t grain(int64_t channels) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(channels, 1)); }

constexpr int64_t kBlockElements = 1024;  // rows are processed in blocks of about this many elements

// Log-density of n elements with per-element std, as one flat vectorised loop with the polynomial
// log. Returns false (and leaves `elems` unspecified) when some std is not a normal positive float.
template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES bool elements_fast(const scalar_t* x, const scalar_t* mean, const scalar_t* std, acc_t* elems, int64_t n) {
  const acc_t log_sqrt_2pi = acc_t(kLogSqrt2Pi);
  int fast = 1;
#pragma omp simd reduction(& : fast)
  for (int64_t i = 0; i < n; ++i) {
    const acc_t s = acc_t(std[i]);
    const acc_t z = (acc_t(x[i]) - acc_t(mean[i])) / s;
    elems[i] = acc_t(-0.5) * z * z - cpu::log_fast(s) - log_sqrt_2pi;
    fast &= int(cpu::log_fast_valid(s));
  }
  return fast;
}

// The same with std::log and the reference's policy: NaN where std <= 0.
template <typename scalar_t, typename acc_t>
void elements_exact(const scalar_t* x, const scalar_t* mean, const scalar_t* std, acc_t* elems, int64_t n) {
  const acc_t log_sqrt_2pi = acc_t(kLogSqrt2Pi);
  for (int64_t i = 0; i < n; ++i) {
    const acc_t s = acc_t(std[i]);
    const acc_t z = (acc_t(x[i]) - acc_t(mean[i])) / s;
    elems[i] = s > 0 ? acc_t(-0.5) * z * z - std::log(s) - log_sqrt_2pi : std::numeric_limits<acc_t>::quiet_NaN();
  }
}

// Quadratic terms -0.5 ((x - mean) / std)^2 of `rows` rows that share one std per row.
template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void quad_terms_row_std(const scalar_t* x, const scalar_t* mean, const scalar_t* std, acc_t* quad,
                                           int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const acc_t s = acc_t(std[r]);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const acc_t z = (acc_t(x[r * C + c]) - acc_t(mean[r * C + c])) / s;
      quad[r * C + c] = acc_t(-0.5) * z * z;
    }
  }
}

// Rows [begin, end) of the forward, in blocks of whole rows: the elements as flat vectorised loops,
// then (reduce sum / mean) the row sums. kStore: write each row's C elements (reduce none).
template <bool kStore, typename scalar_t, typename acc_t>
void fwd_rows(const Args& a, acc_t* out, int64_t begin, int64_t end) {
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const scalar_t* mean = a.mean.data_ptr<scalar_t>();
  const scalar_t* std = a.std.data_ptr<scalar_t>();
  const int64_t C = a.channels;
  // reduce mean over C == 0 channels: 0 * inf = NaN, the mean of nothing
  const acc_t scale = a.reduce == kMean ? acc_t(1) / acc_t(C) : acc_t(1);
  const int64_t block_rows = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(C, 1));
  std::vector<acc_t> buffer(kStore ? 0 : block_rows * C);
  for (int64_t r0 = begin; r0 < end; r0 += block_rows) {
    const int64_t rows = std::min(block_rows, end - r0), n = rows * C, o = r0 * C;
    acc_t* elems = kStore ? out + o : buffer.data();
    if (a.per_row_std) {
      quad_terms_row_std(x + o, mean + o, std + r0, elems, rows, C);
      if constexpr (!kStore) cpu::row_sums(elems, rows, C, scale, out + r0);
      for (int64_t r = 0; r < rows; ++r) {
        // the row's log term, computed once: NaN when std <= 0, as in the reference
        const acc_t s = acc_t(std[r0 + r]);
        const acc_t shift = s > 0 ? std::log(s) + acc_t(kLogSqrt2Pi) : std::numeric_limits<acc_t>::quiet_NaN();
        if constexpr (kStore) {
          for (int64_t c = 0; c < C; ++c) elems[r * C + c] -= shift;
        } else if (C > 0) {
          out[r0 + r] -= acc_t(C) * shift * scale;
        }
      }
    } else {
      if (!elements_fast(x + o, mean + o, std + o, elems, n)) elements_exact(x + o, mean + o, std + o, elems, n);
      if constexpr (!kStore) cpu::row_sums(elems, rows, C, scale, out + r0);
    }
  }
}

template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void bwd_rows(const Args& a, const acc_t* grad_out, acc_t* grad_x, acc_t* grad_mean,
                                 acc_t* grad_std, int64_t begin, int64_t end) {
  const scalar_t* x = a.x.data_ptr<scalar_t>();
  const scalar_t* mean = a.mean.data_ptr<scalar_t>();
  const scalar_t* std = a.std.data_ptr<scalar_t>();
  const int64_t C = a.channels;
  const bool none = a.reduce == kNone;
  // a per-row std of a single-channel row is the per-element case: no sum over channels
  const bool sum_std = a.per_row_std && C != 1;
  for (int64_t r = begin; r < end; ++r) {
    acc_t ge_row = 0;
    if (!none) ge_row = a.reduce == kMean ? grad_out[r] / acc_t(C) : grad_out[r];
    const acc_t row_std = a.per_row_std ? acc_t(std[r]) : acc_t(0);
    acc_t std_sum = 0;
#pragma omp simd reduction(+ : std_sum)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      const acc_t ge = none ? grad_out[i] : ge_row;
      const acc_t s = a.per_row_std ? row_std : acc_t(std[i]);
      acc_t gx, gs;
      element_grads(ge, acc_t(x[i]) - acc_t(mean[i]), s, gx, gs);
      grad_x[i] = gx;
      grad_mean[i] = -gx;
      if (!sum_std) grad_std[i] = gs;
      std_sum += gs;
    }
    if (sum_std) grad_std[r] = std_sum;
  }
}

at::Tensor fwd_cpu(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& std, int64_t reduce) {
  const Args a = prepare("gaussian_logprob_fwd", x, mean, std, reduce);
  const auto out_dtype = acc_dtype(a.x.scalar_type());
  at::Tensor out = a.reduce == kNone ? at::empty({a.rows, a.channels}, a.x.options().dtype(out_dtype))
                                     : at::empty({a.rows}, a.x.options().dtype(out_dtype));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(), "gaussian_logprob_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    acc_t* o = out.data_ptr<acc_t>();
    at::parallel_for(0, a.rows, grain(a.channels), [&](int64_t begin, int64_t end) {
      if (a.reduce == kNone) {
        fwd_rows<true, scalar_t, acc_t>(a, o, begin, end);
      } else {
        fwd_rows<false, scalar_t, acc_t>(a, o, begin, end);
      }
    });
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
    at::parallel_for(0, a.rows, grain(a.channels), [&](int64_t begin, int64_t end) {
      bwd_rows<scalar_t, acc_t>(a, g.data_ptr<acc_t>(), grad_x.data_ptr<acc_t>(), grad_mean.data_ptr<acc_t>(),
                                grad_std.data_ptr<acc_t>(), begin, end);
    });
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
