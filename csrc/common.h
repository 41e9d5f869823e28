// Shared helpers of the margrpo kernels: argument checks with explicit messages, the accumulation
// dtype rule of margrpo/ops/reference.py, and the order-preserving keys used by top-k.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace margrpo {

// fp64 inputs compute and return fp64; fp16 / bf16 / fp32 inputs compute and return fp32.
inline at::ScalarType acc_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kDouble || t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

// `op: name must be a floating tensor (float64/32/16, bfloat16), got Long`
inline void check_floating(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(is_float_dtype(t.scalar_type()), op, ": ", name,
              " must be a floating tensor (float64, float32, float16 or bfloat16), got ", t.scalar_type());
}

// `op: name must be 2-D [R, C], got shape [4, 5, 6]`
inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim, const char* layout) {
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", layout, ", got shape ", t.sizes());
}

// `op: mean must have the shape of x [3, 16], got [3, 15]`
inline void check_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef expected,
                        const char* what) {
  TORCH_CHECK(t.sizes() == expected, op, ": ", name, " must have the shape of ", what, " ", expected, ", got ",
              t.sizes());
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t, const at::Tensor& first,
                              const char* first_name) {
  TORCH_CHECK(t.device() == first.device(), op, ": ", name, " is on ", t.device(), " but ", first_name, " is on ",
              first.device(), "; expected every input on one device");
}

// The kernels read one element type per operand group. When the operands of a group differ in dtype
// the reference casts them all to the accumulation dtype of the leading operand: do the same.
inline at::ScalarType unify_dtype(std::initializer_list<at::Tensor*> group) {
  const at::ScalarType lead = (*group.begin())->scalar_type();
  bool same = true;
  for (const at::Tensor* t : group) same = same && t->scalar_type() == lead;
  if (same) return lead;
  const at::ScalarType acc = acc_dtype(lead);
  for (at::Tensor* t : group) *t = t->to(acc);
  return acc;
}

// ------------------------------------------------------------------ order-preserving keys for top-k
// Unsigned keys whose integer order is the order of the float values: -0.0 and +0.0 map to one key
// (they compare equal, so ties go to the lower index), and NaN maps to the largest key (a descending
// torch.sort puts NaN first). The CUDA radix select and the CPU selection both use these keys.
template <typename acc_t>
using key_type_t = std::conditional_t<std::is_same_v<acc_t, double>, uint64_t, uint32_t>;

template <typename acc_t>
C10_HOST_DEVICE inline key_type_t<acc_t> order_key(acc_t v) {
  // integer tests only: float compares would flush denormals to zero under fast-math device code
  using key_t = key_type_t<acc_t>;
  constexpr key_t sign = key_t(1) << (8 * sizeof(key_t) - 1);
  constexpr key_t inf = std::is_same_v<acc_t, double> ? key_t(0x7FF0000000000000ull) : key_t(0x7F800000u);
  key_t bits;
  memcpy(&bits, &v, sizeof(key_t));
  const key_t magnitude = bits & ~sign;
  if (magnitude > inf) return ~key_t(0);  // NaN
  if (magnitude == 0) bits = 0;            // -0.0 -> +0.0
  return (bits & sign) ? ~bits : (bits | sign);
}

}  // namespace margrpo
