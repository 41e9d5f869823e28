// consistency_mask_fwd on the CPU: one pass over the three [M, C] inputs, rows split across threads;
// per row five fused sums (cur.final, prev.final, |cur|^2, |prev|^2, |final|^2).
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "consistency.h"

namespace margrpo::consistency {
namespace {

at::Tensor fwd_cpu(const at::Tensor& prev_in, const at::Tensor& cur_in, const at::Tensor& final_in,
                   double threshold) {
  const Args a = prepare("consistency_mask_fwd", prev_in, cur_in, final_in);
  const int64_t M = a.cur.size(0), C = a.cur.size(1);
  at::Tensor out = at::empty({M}, a.cur.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.cur.scalar_type(), "consistency_mask_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* prev = a.prev.data_ptr<scalar_t>();
    const scalar_t* cur = a.cur.data_ptr<scalar_t>();
    const scalar_t* fin = a.final.data_ptr<scalar_t>();
    const acc_t thr = acc_t(threshold);  // torch compares an fp32 tensor with the float cast of a scalar
    bool* o = out.data_ptr<bool>();
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        acc_t cur_fin = 0, prev_fin = 0, cur2 = 0, prev2 = 0, fin2 = 0;
        for (int64_t c = m * C; c < (m + 1) * C; ++c) {
          const acc_t p = acc_t(prev[c]), q = acc_t(cur[c]), f = acc_t(fin[c]);
          cur_fin += q * f;
          prev_fin += p * f;
          cur2 += q * q;
          prev2 += p * p;
          fin2 += f * f;
        }
        o[m] = cosine_or_zero(cur_fin, cur2, fin2) - cosine_or_zero(prev_fin, prev2, fin2) > thr;
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace margrpo::consistency

TORCH_LIBRARY_FRAGMENT(margrpo, m) {
  m.def("consistency_mask_fwd(Tensor prev, Tensor cur, Tensor final, float threshold) -> Tensor");
}

TORCH_LIBRARY_IMPL(margrpo, CPU, m) { m.impl("consistency_mask_fwd", &margrpo::consistency::fwd_cpu); }
