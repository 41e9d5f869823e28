"""Triton kernel of the consistency-aware selection mask (MAR-GRPO mechanism 4).

keep[m] = cos(cur[m], final[m]) - cos(prev[m], final[m]) > threshold, with the cosine defined as 0
when either vector has zero norm. One pass: a program walks its [BLOCK_M, BLOCK_C] tile over the
channels accumulating the five sums the two cosines need (cur.final, prev.final, |cur|^2, |prev|^2,
|final|^2), so each input is read once.

Numerics: fp32 accumulation (fp64 for fp64 inputs). threshold is passed to the kernel as an fp32
scalar (Triton types Python floats as fp32), so for fp64 inputs it is rounded to fp32 first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import acc_dtype, programs_block, require_contiguous, warps_for

MAX_BLOCK_C = 64


@triton.jit
def _cosine_or_zero(dot, norm_a2, norm_b2, TINY: tl.constexpr):
    """dot / (|a| |b|) with the same form as the oracle; 0 when the norm product is 0."""
    norm2 = norm_a2 * norm_b2
    return tl.where(norm2 > 0, dot / tl.sqrt(tl.maximum(norm2, TINY)), 0.0)


@triton.jit(do_not_specialize=["M"])
def _consistency_mask_kernel(
    prev_ptr,
    cur_ptr,
    final_ptr,
    out_ptr,
    M,
    C,
    threshold,
    COMPUTE_DTYPE: tl.constexpr,
    TINY: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cur_final = tl.zeros([BLOCK_M], dtype=COMPUTE_DTYPE)
    prev_final = tl.zeros([BLOCK_M], dtype=COMPUTE_DTYPE)
    cur_cur = tl.zeros([BLOCK_M], dtype=COMPUTE_DTYPE)
    prev_prev = tl.zeros([BLOCK_M], dtype=COMPUTE_DTYPE)
    final_final = tl.zeros([BLOCK_M], dtype=COMPUTE_DTYPE)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        ok = row_ok[:, None] & (cols < C)[None, :]
        offs = rows.to(tl.int64)[:, None] * C + cols[None, :]
        prev = tl.load(prev_ptr + offs, mask=ok, other=0.0).to(COMPUTE_DTYPE)
        cur = tl.load(cur_ptr + offs, mask=ok, other=0.0).to(COMPUTE_DTYPE)
        final = tl.load(final_ptr + offs, mask=ok, other=0.0).to(COMPUTE_DTYPE)
        cur_final += tl.sum(cur * final, axis=1)
        prev_final += tl.sum(prev * final, axis=1)
        cur_cur += tl.sum(cur * cur, axis=1)
        prev_prev += tl.sum(prev * prev, axis=1)
        final_final += tl.sum(final * final, axis=1)
    gain = _cosine_or_zero(cur_final, cur_cur, final_final, TINY) - _cosine_or_zero(prev_final, prev_prev, final_final, TINY)
    tl.store(out_ptr + rows.to(tl.int64), gain > threshold, mask=row_ok)


def _blocks(M: int, C: int) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(max(C, 1)), MAX_BLOCK_C)
    block_m = programs_block(M, max_block=max(1, 2048 // block_c), min_block=max(1, 256 // block_c))
    return block_m, block_c


def consistency_mask_fwd(prev: torch.Tensor, cur: torch.Tensor, final: torch.Tensor, threshold: float) -> torch.Tensor:
    """prev, cur, final: [M, C] -> bool [M]: cos(cur, final) - cos(prev, final) > threshold."""
    for name, t in (("prev", prev), ("cur", cur), ("final", final)):
        require_contiguous(name, t, 2)
        if t.shape != cur.shape:
            raise ValueError(f"{name}: expected shape {tuple(cur.shape)} (as cur), got {tuple(t.shape)}")
    M, C = cur.shape
    out = torch.empty((M,), dtype=torch.bool, device=cur.device)
    if M == 0:
        return out
    dt = acc_dtype(cur.dtype)
    block_m, block_c = _blocks(M, C)
    _consistency_mask_kernel[(triton.cdiv(M, block_m),)](
        prev,
        cur,
        final,
        out,
        M,
        C,
        float(threshold),
        COMPUTE_DTYPE=tl.float64 if dt == torch.float64 else tl.float32,
        TINY=torch.finfo(dt).tiny,
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        num_warps=warps_for(block_m * block_c),
    )
    return out
