// topk_mask_fwd / topk_indices_fwd on CUDA, one block per row.
//
// Mask (any N): radix select on the order-preserving keys of common.h, 8 bits per pass from the top:
// each pass histograms the digit of the keys that match the prefix found so far and picks the digit
// that holds the k-th largest key. A last pass marks every key above that k-th key, and the lowest
// indices among the keys equal to it (a block-wide prefix count in index order), so exactly k per row.
//
// Ordered indices (32-bit keys, N <= 4096): a block radix sort of (key, index) packed into one unique
// 64-bit word, sorted descending: larger scores first, ties to the lower index. Wider rows and fp64
// scores fall back to a stable descending at::sort, which is the reference's own definition.
#include <ATen/OpMathType.h>
#include <ATen/ops/sort.h>
#include <torch/library.h>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda_utils.cuh"
#include "topk.h"

namespace margrpo::topk {
namespace {

using cuda::kFullMask;
using cuda::kWarpSize;

constexpr int kSelectBlock = 512;
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;
static_assert(kDigits == 8 * kWarpSize, "one warp scans the histogram, 8 digits per lane");

template <typename scalar_t, typename acc_t>
__global__ void __launch_bounds__(kSelectBlock) mask_kernel(const scalar_t* __restrict__ scores,
                                                            bool* __restrict__ mask, int64_t N, int k) {
  using key_t = key_type_t<acc_t>;
  using BlockScan = cub::BlockScan<int, kSelectBlock>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int histogram[kDigits];
  __shared__ int found_digit, found_above;
  const scalar_t* row = scores + int64_t(blockIdx.x) * N;
  bool* out = mask + int64_t(blockIdx.x) * N;

  // digits of the k-th largest key found so far, and its rank among the keys that share them
  key_t prefix = 0, prefix_mask = 0;
  int rank = k;  // 1-based, counted from the largest
  for (int shift = int(8 * sizeof(key_t)) - kDigitBits; shift >= 0; shift -= kDigitBits) {
    for (int d = threadIdx.x; d < kDigits; d += blockDim.x) histogram[d] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const key_t key = order_key<acc_t>(acc_t(row[i]));
      if ((key & prefix_mask) == prefix) atomicAdd(&histogram[int((key >> shift) & (kDigits - 1))], 1);
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
      // lane j owns the digits 255 - 8j down to 248 - 8j; an inclusive scan over lanes counts the
      // keys at or above each lane's digits, and the lane whose range reaches `rank` finds the digit
      const int lane = threadIdx.x;
      int counts[8], own = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        counts[q] = histogram[kDigits - 1 - 8 * lane - q];
        own += counts[q];
      }
      int through = own;
      for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const int below = __shfl_up_sync(kFullMask, through, offset);
        if (lane >= offset) through += below;
      }
      int above = through - own;
      if (above < rank && rank <= through) {
        for (int q = 0; q < 8; ++q) {
          if (above + counts[q] >= rank) {
            found_digit = kDigits - 1 - 8 * lane - q;
            found_above = above;
            break;
          }
          above += counts[q];
        }
      }
    }
    __syncthreads();
    prefix |= key_t(found_digit) << shift;
    prefix_mask |= key_t(kDigits - 1) << shift;
    rank -= found_above;
    __syncthreads();  // histogram and found_* are rewritten by the next pass
  }

  // prefix is the k-th largest key; `rank` keys equal to it are taken, the lowest indices first
  int ties_taken = 0;
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const key_t key = i < N ? order_key<acc_t>(acc_t(row[i])) : key_t(0);
    const bool tie = i < N && key == prefix;
    int before, ties;
    BlockScan(scan_storage).ExclusiveSum(int(tie), before, ties);
    if (i < N) out[i] = key > prefix || (tie && ties_taken + before < rank);
    ties_taken += ties;
    __syncthreads();  // scan_storage is reused by the next chunk
  }
}

constexpr int kSortThreads = 512;
constexpr int kSortItems = 8;
constexpr int kSortCapacity = kSortThreads * kSortItems;  // 4096 scores per row
constexpr int kIndexBits = 12;                            // log2(kSortCapacity)
static_assert((1 << kIndexBits) == kSortCapacity, "the packed index field must hold every position");

// Packs a 32-bit key and a position into a word whose descending order is: larger key first, then
// lower position. Real keys are >= 1 (NaN maps to the top), so the padding word 0 sorts last.
__device__ __forceinline__ uint64_t pack(uint32_t key, int position) {
  return (uint64_t(key) << kIndexBits) | uint64_t(kSortCapacity - 1 - position);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kSortThreads) sorted_indices_kernel(const scalar_t* __restrict__ scores,
                                                                      int64_t* __restrict__ out, int N, int k) {
  using Sort = cub::BlockRadixSort<uint64_t, kSortThreads, kSortItems>;
  __shared__ typename Sort::TempStorage storage;
  const scalar_t* row = scores + int64_t(blockIdx.x) * N;
  uint64_t words[kSortItems];
  // the words are unique, so their arrangement before the sort does not matter: load coalesced
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const int i = j * kSortThreads + threadIdx.x;
    words[j] = i < N ? pack(order_key<float>(float(row[i])), i) : uint64_t(0);
  }
  Sort(storage).SortDescendingBlockedToStriped(words, 0, 32 + kIndexBits);
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const int position = j * kSortThreads + threadIdx.x;  // striped: rank j * threads + thread
    if (position < k) {
      out[int64_t(blockIdx.x) * k + position] = kSortCapacity - 1 - int(words[j] & (kSortCapacity - 1));
    }
  }
}

at::Tensor mask_cuda(const at::Tensor& scores_in, int64_t k) {
  const at::Tensor scores = prepare("topk_mask_fwd", scores_in, k);
  const c10::cuda::CUDAGuard guard(scores.device());
  const int64_t B = scores.size(0), N = scores.size(1);
  at::Tensor out = at::empty({B, N}, scores.options().dtype(at::kBool));
  if (out.numel() == 0) return out;
  if (k == 0 || k == N) return out.fill_(k == N);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scores.scalar_type(), "topk_mask_fwd_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    mask_kernel<scalar_t, acc_t><<<unsigned(B), kSelectBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        scores.data_ptr<scalar_t>(), out.data_ptr<bool>(), N, int(k));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

template <typename scalar_t>
void launch_sorted_indices(const at::Tensor& scores, at::Tensor& out, int64_t k) {
  sorted_indices_kernel<scalar_t><<<unsigned(scores.size(0)), kSortThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      scores.data_ptr<scalar_t>(), out.data_ptr<int64_t>(), int(scores.size(1)), int(k));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor indices_cuda(const at::Tensor& scores_in, int64_t k) {
  const at::Tensor scores = prepare("topk_indices_fwd", scores_in, k);
  const c10::cuda::CUDAGuard guard(scores.device());
  const int64_t B = scores.size(0), N = scores.size(1);
  if (B == 0 || k == 0) return at::empty({B, k}, scores.options().dtype(at::kLong));
  if (N > kSortCapacity || scores.scalar_type() == at::kDouble) {
    // stable descending sort of the accumulation-dtype scores: ties keep index order
    const at::Tensor order = std::get<1>(at::sort(scores.to(acc_dtype(scores.scalar_type())), true, 1, true));
    return order.narrow(1, 0, k).contiguous();
  }
  at::Tensor out = at::empty({B, k}, scores.options().dtype(at::kLong));
  switch (scores.scalar_type()) {
    case at::kFloat:
      launch_sorted_indices<float>(scores, out, k);
      break;
    case at::kHalf:
      launch_sorted_indices<at::Half>(scores, out, k);
      break;
    case at::kBFloat16:
      launch_sorted_indices<at::BFloat16>(scores, out, k);
      break;
    default:
      TORCH_INTERNAL_ASSERT(false, "topk_indices_fwd: unexpected dtype ", scores.scalar_type());
  }
  return out;
}

}  // namespace
}  // namespace margrpo::topk

TORCH_LIBRARY_IMPL(margrpo, CUDA, m) {
  m.impl("topk_mask_fwd", &margrpo::topk::mask_cuda);
  m.impl("topk_indices_fwd", &margrpo::topk::indices_cuda);
}
