// What the CPU kernels' inner loops need to vectorise:
// - MARGRPO_CPU_CLONES: CPU-specific clones of every function with a hot loop;
// - log_fast / exp_fast: glibc's logf/expf are calls the compiler cannot vectorise, which leaves a
//   one-pass kernel slower than torch's vectorised (Sleef) eager ops; the float versions here are the
//   branch-free Cephes polynomials (about 1 ulp) and inline into `#pragma omp simd` loops. double
//   keeps std::log / std::exp: fp64 is the exact reference path of the tests;
// - row_sums: sums of short rows without a horizontal add per row.
// GCC vectorises the selects here only with -fno-trapping-math (see setup.py).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

// Every function with a hot vector loop is compiled three times, for x86-64-v4 (AVX-512), x86-64-v3
// (AVX2 + FMA) and baseline x86-64, and the loader picks the best clone the CPU runs (GCC function
// multi-versioning): up to 4x the vector width of the baseline without building for one machine.
// A clone does not reliably inline the plain functions it calls, so those carry the attribute too.
// Other compilers and architectures get one version.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MARGRPO_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MARGRPO_CPU_CLONES
#endif

namespace margrpo::cpu {

// log(x) for finite x >= FLT_MIN (normal, positive); other inputs give unspecified values.
inline float log_normal(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x);
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)): keeps the polynomial's argument m - 1 small
  int32_t e = ((bits >> 23) & 0xff) - 126;
  float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f000000);  // [0.5, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1 : e;
  // both candidates computed, then selected: a conditional float operation would block if-conversion
  const float doubled = m + m;
  const float f = (low ? doubled : m) - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float fe = float(e);
  // log 2 split in two parts so fe * log 2 adds without rounding error
  float y = p * f * z - 2.12194440e-4f * fe - 0.5f * z;
  return f + y + 0.693359375f * fe;
}

// exp(x) for |x| <= 80 (the callers clamp to +-20); NaN stays NaN.
inline float exp_bounded(float x) {
  const bool nan = x != x;
  const float xs = nan ? 0.0f : x;  // a NaN must not reach the float -> int conversion
  // xs = n log 2 + r with |r| <= log(2) / 2, then exp(xs) = 2^n exp(r)
  const float t = xs * 1.44269504088896341f;
  const int32_t n = int32_t(std::round(t));  // a select-based rounding here keeps GCC from vectorising
  const float fn = float(n);
  const float r = xs - fn * 0.693359375f + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * r * r + r + 1.0f;
  const float result = exp_r * std::bit_cast<float>((n + 127) << 23);
  return nan ? x : result;
}

// The inner-loop versions by accumulation type. log_fast(float) needs log_fast_valid(x) (a normal
// positive float); a kernel checks that for all its elements and redoes the rare invalid rows with
// std::log, which handles zero, negative, subnormal, inf and NaN like the reference.
inline float log_fast(float x) { return log_normal(x); }
inline double log_fast(double x) { return std::log(x); }
inline bool log_fast_valid(float x) { return x >= 1.17549435e-38f && x <= 3.40282347e+38f; }
inline bool log_fast_valid(double x) { return x > 0; }  // std::log is exact; NaN policy aside
inline float exp_fast(float x) { return exp_bounded(x); }
inline double exp_fast(double x) { return std::exp(x); }

// Sums of the `rows` rows of a contiguous [rows, C] block, times `scale`, into out[0, rows). Rows of
// the kernels are short (C = 16), and a vectorised sum per row spends most of its time on the final
// horizontal add; instead kRowLanes rows are summed side by side, one vector lane per row (strided
// loads), which needs no horizontal step.
constexpr int kRowLanes = 16;

template <typename acc_t>
MARGRPO_CPU_CLONES void row_sums(const acc_t* block, int64_t rows, int64_t C, acc_t scale, acc_t* out) {
  int64_t r0 = 0;
  for (; r0 + kRowLanes <= rows; r0 += kRowLanes) {
    acc_t sums[kRowLanes] = {};
    for (int64_t c = 0; c < C; ++c) {
      for (int j = 0; j < kRowLanes; ++j) sums[j] += block[(r0 + j) * C + c];
    }
    for (int j = 0; j < kRowLanes; ++j) out[r0 + j] = sums[j] * scale;
  }
  for (; r0 < rows; ++r0) {
    acc_t sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += block[r0 * C + c];
    out[r0] = sum * scale;
  }
}

}  // namespace margrpo::cpu
