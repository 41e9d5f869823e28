"""Triton kernels for exact per-row top-k (uncertainty top-k of MAR-GRPO, mechanism 3).

Order: descending score; equal scores go to the lower index (as a stable descending sort). Scores
are compared through an order-preserving integer key (32-bit for fp16/bf16/fp32, 64-bit for fp64,
so fp64 ranks exactly); -0.0 ranks equal to +0.0 as in torch.sort. Scores must not be NaN.

Two building blocks, one program per row:
- select: finds the k-th largest key by a radix search (a counting pass per 4-bit digit compares
  the row with 16 candidate thresholds: 8 passes for 32-bit keys, 16 for 64-bit), then keeps every
  key above it plus the first (k - #above) keys equal to it in index order. Exactly k per row, any N,
  no sort. It writes the bool mask (topk_mask_fwd), or the selected indices compacted in index order
  (the first step of topk_indices_fwd for long rows).
- sort: a bitonic sort of (key, index) pairs held in registers, descending key then ascending index.
  Rows that fit one sort block (N <= MAX_SORT_BLOCK) are sorted whole in one launch; longer rows are
  first reduced to their k selected candidates, which are then sorted (k <= MAX_SORT_BLOCK).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import require_contiguous, warps_for

# the largest row (or candidate list) sorted in one program: 16384 (key, index) pairs in registers
MAX_SORT_BLOCK = 16384
# chunk of a row that the select kernel counts at a time (it compares a chunk with 16 candidates)
MAX_SELECT_BLOCK = 1024
RADIX_BITS = tl.constexpr(4)
RADIX = tl.constexpr(16)  # 2 ** RADIX_BITS candidate digits per pass


@triton.jit
def _order_key(x, KEY_BITS: tl.constexpr):
    """Signed integer key with the same order as the float x (not NaN); -0.0 gets +0.0's key."""
    if KEY_BITS == 64:
        bits = x.to(tl.float64).to(tl.int64, bitcast=True)
        magnitude_bits = 0x7FFFFFFFFFFFFFFF
    else:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        magnitude_bits = 0x7FFFFFFF
    # +-0.0 are the only patterns with every bit but the sign clear: map both to +0.0 on the
    # integer side, where no float simplification can undo it
    bits = tl.where((bits << 1) == 0, 0, bits)
    # negative floats order by decreasing magnitude: flip their magnitude bits
    return bits ^ ((bits >> (KEY_BITS - 1)) & magnitude_bits)


@triton.jit
def _chunk_keys(row_ptr, start, N, KEY_BITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)
    ok = offs < N
    return _order_key(tl.load(row_ptr + offs, mask=ok, other=0.0), KEY_BITS), ok, offs


@triton.jit
def _count_at_least(row_ptr, N, cands, KEY_BITS: tl.constexpr, BLOCK: tl.constexpr):
    """For each candidate key of the 1-D block cands: how many keys of the row are >= it."""
    counts = tl.zeros(cands.shape, tl.int32)
    for start in range(0, N, BLOCK):
        keys, ok, _ = _chunk_keys(row_ptr, start, N, KEY_BITS, BLOCK)
        counts += tl.sum(((keys[:, None] >= cands[None, :]) & ok[:, None]).to(tl.int32), axis=0)
    return counts


@triton.jit
def _topk_select_kernel(
    scores_ptr,
    out_ptr,
    N,
    k,
    KEY_BITS: tl.constexpr,
    WRITE_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = scores_ptr + row * N
    key_dtype = tl.int64 if KEY_BITS == 64 else tl.int32
    # Radix search for the k-th largest key, RADIX_BITS bits per counting pass from the top.
    # In the unsigned view (key + 2^(KEY_BITS-1)) the undecided bits are 0 and a digit is added by
    # xor; the signed view differs only in the sign bit, so the same xor works on signed keys.
    # Counts fall as the digit grows: the largest digit whose count reaches k is the next digit.
    digits = tl.arange(0, RADIX).to(key_dtype)
    threshold = tl.full([], 1, key_dtype) << (KEY_BITS - 1)  # the smallest key: all digits 0
    for p in range(KEY_BITS // RADIX_BITS):
        shift = KEY_BITS - RADIX_BITS * (p + 1)
        counts = _count_at_least(row_ptr, N, threshold ^ (digits << shift), KEY_BITS, BLOCK)
        digit = tl.sum((counts >= k).to(tl.int32), axis=0) - 1
        threshold = threshold ^ (digit.to(key_dtype) << shift)
    # keys above the threshold are all in; ties fill the remaining places in index order
    # (k >= 1, so the threshold is a real key and threshold + 1 cannot overflow)
    above = _count_at_least(row_ptr, N, tl.full([1], 1, key_dtype) + threshold, KEY_BITS, BLOCK)
    ties_wanted = k - tl.sum(above, axis=0)
    ties_before = tl.full([], 0, tl.int32)
    taken_before = tl.full([], 0, tl.int32)
    for start in range(0, N, BLOCK):
        keys, ok, offs = _chunk_keys(row_ptr, start, N, KEY_BITS, BLOCK)
        tie = (ok & (keys == threshold)).to(tl.int32)
        tie_rank = ties_before + tl.cumsum(tie, axis=0) - tie  # ties at lower indices
        selected = ok & ((keys > threshold) | ((tie != 0) & (tie_rank < ties_wanted)))
        if WRITE_INDICES:
            # compact in index order: slot = selected elements before this one
            taken = selected.to(tl.int32)
            slot = taken_before + tl.cumsum(taken, axis=0) - taken
            tl.store(out_ptr + row * k + slot, offs, mask=selected)
            taken_before += tl.sum(taken, axis=0)
        else:
            tl.store(out_ptr + row * N + offs, selected, mask=ok)
        ties_before += tl.sum(tie, axis=0)


@triton.jit
def _compare_swap(key, idx, DIST: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr):
    """One bitonic step: element i meets element i ^ DIST; blocks of SPAN elements alternate
    between descending (even blocks) and ascending order."""
    key3 = tl.reshape(key, [BLOCK // (2 * DIST), 2, DIST])
    idx3 = tl.reshape(idx, [BLOCK // (2 * DIST), 2, DIST])
    # the partner's value is the pair's sum minus our own (integer wrap-around keeps it exact)
    partner_key = tl.reshape(tl.sum(key3, axis=1, keep_dims=True) - key3, [BLOCK])
    partner_idx = tl.reshape(tl.sum(idx3, axis=1, keep_dims=True) - idx3, [BLOCK])
    pos = tl.arange(0, BLOCK)
    descending = (pos & SPAN) == 0
    wants_greater = ((pos & DIST) != 0) != descending
    # "greater" ranks first: larger key, or equal key and smaller index (a strict total order)
    is_greater = (key > partner_key) | ((key == partner_key) & (idx < partner_idx))
    keep = is_greater == wants_greater
    return tl.where(keep, key, partner_key), tl.where(keep, idx, partner_idx)


@triton.jit
def _bitonic_sort_desc(key, idx, LOG_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    for stage in tl.static_range(1, LOG_BLOCK + 1):
        for step in tl.static_range(stage):
            key, idx = _compare_swap(key, idx, 1 << (stage - 1 - step), 1 << stage, BLOCK)
    return key, idx


@triton.jit
def _topk_sort_kernel(
    scores_ptr,
    candidates_ptr,
    out_ptr,
    N,
    n_sort,
    k,
    KEY_BITS: tl.constexpr,
    FROM_CANDIDATES: tl.constexpr,
    LOG_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sorts n_sort entries of a row (the whole row, or its k candidates) and writes the first k."""
    row = tl.program_id(0).to(tl.int64)
    pos = tl.arange(0, BLOCK)
    valid = pos < n_sort
    if FROM_CANDIDATES:
        idx = tl.load(candidates_ptr + row * k + pos, mask=valid, other=0)
    else:
        idx = pos
    key = _order_key(tl.load(scores_ptr + row * N + idx, mask=valid, other=0.0), KEY_BITS)
    # padding gets the smallest key and an index past the row, so it sorts after every entry
    smallest = tl.full([BLOCK], 1, key.dtype) << (KEY_BITS - 1)
    key = tl.where(valid, key, smallest)
    idx = tl.where(valid, idx, N + pos)
    key, idx = _bitonic_sort_desc(key, idx, LOG_BLOCK, BLOCK)
    tl.store(out_ptr + row * k + pos, idx.to(tl.int64), mask=pos < k)


def _check(scores: torch.Tensor, k: int) -> None:
    require_contiguous("scores", scores, 2)
    if not scores.is_floating_point():
        raise ValueError(f"scores: expected a floating-point tensor, got {scores.dtype}")
    if not 0 <= k <= scores.shape[1]:
        raise ValueError(f"k: expected 0 <= k <= N = {scores.shape[1]}, got {k}")


def _key_bits(scores: torch.Tensor) -> int:
    return 64 if scores.dtype == torch.float64 else 32


def _launch_select(scores: torch.Tensor, k: int, out: torch.Tensor, write_indices: bool) -> None:
    B, N = scores.shape
    block = min(triton.next_power_of_2(N), MAX_SELECT_BLOCK)
    _topk_select_kernel[(B,)](
        scores,
        out,
        N,
        k,
        KEY_BITS=_key_bits(scores),
        WRITE_INDICES=write_indices,
        BLOCK=block,
        num_warps=warps_for(block),
    )


def _launch_sort(scores: torch.Tensor, candidates: torch.Tensor | None, n_sort: int, k: int, out: torch.Tensor) -> None:
    B, N = scores.shape
    block = triton.next_power_of_2(n_sort)
    _topk_sort_kernel[(B,)](
        scores,
        candidates if candidates is not None else out,
        out,
        N,
        n_sort,
        k,
        KEY_BITS=_key_bits(scores),
        FROM_CANDIDATES=candidates is not None,
        LOG_BLOCK=block.bit_length() - 1,
        BLOCK=block,
        num_warps=warps_for(block),
    )


def _topk_indices(scores: torch.Tensor, k: int, max_sort_block: int) -> torch.Tensor:
    """topk_indices_fwd with the sort-size limit as a parameter (tests lower it to reach the long-row path)."""
    _check(scores, k)
    B, N = scores.shape
    out = torch.empty((B, k), dtype=torch.int64, device=scores.device)
    if out.numel() == 0:
        return out
    if triton.next_power_of_2(N) <= max_sort_block:
        _launch_sort(scores, None, N, k, out)
        return out
    if triton.next_power_of_2(k) > max_sort_block:
        raise ValueError(
            f"k: rows of N = {N} > {max_sort_block} scores are sorted after selection, which needs k <= {max_sort_block}, got {k}"
        )
    candidates = torch.empty((B, k), dtype=torch.int32, device=scores.device)
    _launch_select(scores, k, candidates, write_indices=True)
    _launch_sort(scores, candidates, k, k, out)
    return out


def topk_indices_fwd(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, N] (no NaN), 0 <= k <= N -> int64 [B, k]: positions of the k largest scores per
    row, by descending score, equal scores toward the lower index. One launch when N <= 16384;
    longer rows select then sort (two launches) and need k <= 16384."""
    return _topk_indices(scores, k, MAX_SORT_BLOCK)


def topk_mask_fwd(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, N] -> bool [B, N] with exactly k True per row (the positions of topk_indices_fwd).
    One launch, any N."""
    _check(scores, k)
    out = torch.empty(tuple(scores.shape), dtype=torch.bool, device=scores.device)
    if k == 0:
        return out.zero_()  # also keeps the kernel's threshold below the largest key
    if out.numel() > 0:
        _launch_select(scores, k, out, write_indices=False)
    return out
