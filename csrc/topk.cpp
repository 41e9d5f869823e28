// topk_indices_fwd / topk_mask_fwd on the CPU: rows split across threads. Scores become
// order-preserving integer keys (common.h), so the selection is an exact integer problem with a
// total order: the mask needs the k-th largest key (nth_element) and two linear passes; the ordered
// indices sort (key, index) pairs, which breaks ties toward the lower index.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "topk.h"

namespace margrpo::topk {
namespace {

template <typename key_t>
struct Entry {
  key_t key;
  int64_t index;
};

// larger key first; among equal keys, the lower index first
template <typename key_t>
bool before(const Entry<key_t>& a, const Entry<key_t>& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// rows per parallel task: about 16k scores
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

template <typename scalar_t, typename acc_t, typename key_t>
void row_keys(const scalar_t* row, int64_t n, key_t* keys) {
  for (int64_t i = 0; i < n; ++i) keys[i] = order_key<acc_t>(acc_t(row[i]));
}

at::Tensor indices_cpu(const at::Tensor& scores_in, int64_t k) {
  const at::Tensor scores = prepare("topk_indices_fwd", scores_in, k);
  const int64_t B = scores.size(0), N = scores.size(1);
  at::Tensor out = at::empty({B, k}, scores.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "topk_indices_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = key_type_t<acc_t>;
    const scalar_t* s = scores.data_ptr<scalar_t>();
    int64_t* o = out.data_ptr<int64_t>();
    at::parallel_for(0, B, grain(N), [&](int64_t begin, int64_t end) {
      std::vector<key_t> keys(N);
      std::vector<Entry<key_t>> entries(N);
      for (int64_t b = begin; b < end; ++b) {
        row_keys<scalar_t, acc_t, key_t>(s + b * N, N, keys.data());
        for (int64_t i = 0; i < N; ++i) entries[i] = {keys[i], i};
        if (k < N) std::nth_element(entries.begin(), entries.begin() + k, entries.end(), before<key_t>);
        std::sort(entries.begin(), entries.begin() + k, before<key_t>);
        for (int64_t j = 0; j < k; ++j) o[b * k + j] = entries[j].index;
      }
    });
  });
  return out;
}

at::Tensor mask_cpu(const at::Tensor& scores_in, int64_t k) {
  const at::Tensor scores = prepare("topk_mask_fwd", scores_in, k);
  const int64_t B = scores.size(0), N = scores.size(1);
  at::Tensor out = at::empty({B, N}, scores.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "topk_mask_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using key_t = key_type_t<acc_t>;
    const scalar_t* s = scores.data_ptr<scalar_t>();
    bool* o = out.data_ptr<bool>();
    at::parallel_for(0, B, grain(N), [&](int64_t begin, int64_t end) {
      std::vector<key_t> keys(N), scratch(N);
      for (int64_t b = begin; b < end; ++b) {
        bool* mask = o + b * N;
        if (k == 0 || k == N) {
          std::fill(mask, mask + N, k == N);
          continue;
        }
        row_keys<scalar_t, acc_t, key_t>(s + b * N, N, keys.data());
        // the k-th largest key: everything above it is taken, ties at it go to the lowest indices
        std::copy(keys.begin(), keys.end(), scratch.begin());
        std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<key_t>());
        const key_t kth = scratch[k - 1];
        int64_t ties_left = k;
        for (int64_t i = 0; i < N; ++i) ties_left -= keys[i] > kth;
        for (int64_t i = 0; i < N; ++i) {
          const bool tie = keys[i] == kth && ties_left > 0;
          ties_left -= tie;
          mask[i] = keys[i] > kth || tie;
        }
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace margrpo::topk

TORCH_LIBRARY_FRAGMENT(margrpo, m) {
  m.def("topk_indices_fwd(Tensor scores, int k) -> Tensor");
  m.def("topk_mask_fwd(Tensor scores, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(margrpo, CPU, m) {
  m.impl("topk_indices_fwd", &margrpo::topk::indices_cpu);
  m.impl("topk_mask_fwd", &margrpo::topk::mask_cpu);
}
