// consistency_mask_fwd on the CPU: one pass over the three [M, C] inputs, rows split across threads;
// per row five fused sums (cur.final, prev.final, |cur|^2, |prev|^2, |final|^2), vectorised across rows.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "consistency.h"
#include "cpu_math.h"

namespace margrpo::consistency {
namespace {

// Rows [begin, end). The five channel sums (cur.final, prev.final, |cur|^2, |prev|^2, |final|^2) of
// cpu::kRowLanes rows are accumulated side by side, one vector lane per row: rows are short (C = 16),
// and this avoids a horizontal add per row and sum (see cpu::row_sums). Leftover rows go one by one.
template <typename scalar_t, typename acc_t>
MARGRPO_CPU_CLONES void fwd_rows(const Args& a, acc_t threshold, bool* out, int64_t begin, int64_t end) {
  constexpr int kLanes = cpu::kRowLanes;
  const int64_t C = a.cur.size(1);
  const scalar_t* prev = a.prev.data_ptr<scalar_t>();
  const scalar_t* cur = a.cur.data_ptr<scalar_t>();
  const scalar_t* fin = a.final.data_ptr<scalar_t>();
  for (int64_t m0 = begin; m0 < end; m0 += kLanes) {
    const int lanes = int(std::min<int64_t>(kLanes, end - m0));
    acc_t cur_fin[kLanes] = {}, prev_fin[kLanes] = {}, cur2[kLanes] = {}, prev2[kLanes] = {}, fin2[kLanes] = {};
    const auto add = [&](int j, int64_t c) {
      const int64_t i = (m0 + j) * C + c;
      const acc_t p = acc_t(prev[i]), q = acc_t(cur[i]), f = acc_t(fin[i]);
      cur_fin[j] += q * f;
      prev_fin[j] += p * f;
      cur2[j] += q * q;
      prev2[j] += p * p;
      fin2[j] += f * f;
    };
    if (lanes == kLanes) {
      for (int64_t c = 0; c < C; ++c) {
        for (int j = 0; j < kLanes; ++j) add(j, c);  // vectorised across the rows
      }
    } else {
      for (int j = 0; j < lanes; ++j) {
        for (int64_t c = 0; c < C; ++c) add(j, c);
      }
    }
    for (int j = 0; j < lanes; ++j) {
      out[m0 + j] = cosine_or_zero(cur_fin[j], cur2[j], fin2[j]) - cosine_or_zero(prev_fin[j], prev2[j], fin2[j]) >
                    threshold;
    }
  }
}

at::Tensor fwd_cpu(const at::Tensor& prev_in, const at::Tensor& cur_in, const at::Tensor& final_in,
                   double threshold) {
  const Args a = prepare("consistency_mask_fwd", prev_in, cur_in, final_in);
  const int64_t M = a.cur.size(0), C = a.cur.size(1);
  at::Tensor out = at::empty({M}, a.cur.options().dtype(at::kBool));
  bool* o = out.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.cur.scalar_type(), "consistency_mask_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t thr = acc_t(threshold);  // torch compares an fp32 tensor with the float cast of a scalar
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t begin, int64_t end) {
      fwd_rows<scalar_t, acc_t>(a, thr, o, begin, end);
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
