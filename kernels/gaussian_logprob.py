"""Triton kernels for the Gaussian log-density of diffusion transitions (contract: ops/oracle.py).

Rows are tokens, columns their C channels (16 typical). Each program owns a [BLOCK_R, BLOCK_C] tile
and walks the channels in BLOCK_C chunks (one chunk when C <= BLOCK_C), so one pass reads every input
once. Math runs in the output dtype: fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 inputs.
std may be per row (S == 1, loaded once per row) or per element (S == C).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from margrpo.ops.oracle import LOG_SQRT_2PI, REDUCE_MEAN, REDUCE_NONE, REDUCE_SUM

from ._util import acc_dtype, programs_block, require_contiguous, warps_for

_NONE = tl.constexpr(REDUCE_NONE)
_MEAN = tl.constexpr(REDUCE_MEAN)
_LOG_SQRT_2PI = tl.constexpr(LOG_SQRT_2PI)
# channels per chunk: C = 16 fits in one chunk; wide rows are walked in pieces of this size
MAX_BLOCK_C = 128


@triton.jit
def _tile(rows, c0, R, C, BLOCK_C: tl.constexpr):
    """Offsets and in-bounds mask of the [BLOCK_R, BLOCK_C] tile at channel c0."""
    cols = c0 + tl.arange(0, BLOCK_C)
    ok = (rows < R)[:, None] & (cols < C)[None, :]
    return rows.to(tl.int64)[:, None] * C + cols[None, :], ok


@triton.jit(do_not_specialize=["R"])
def _gaussian_logprob_fwd_kernel(
    x_ptr,
    mean_ptr,
    std_ptr,
    out_ptr,
    R,
    C,
    REDUCE: tl.constexpr,
    STD_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    dt = out_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    # the constant is materialised in the compute dtype so fp64 keeps all its digits
    log_sqrt_2pi = tl.full([], _LOG_SQRT_2PI, dt)
    if STD_PER_ROW:
        std_row = tl.load(std_ptr + rows.to(tl.int64), mask=row_ok, other=1.0).to(dt)
    total = tl.zeros([BLOCK_R], dtype=dt)
    for c0 in range(0, C, BLOCK_C):
        offs, ok = _tile(rows, c0, R, C, BLOCK_C)
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(dt)
        mean = tl.load(mean_ptr + offs, mask=ok, other=0.0).to(dt)
        if STD_PER_ROW:
            std = std_row[:, None]
        else:
            std = tl.load(std_ptr + offs, mask=ok, other=1.0).to(dt)
        z = (x - mean) / std
        elem = -0.5 * z * z - tl.log(std) - log_sqrt_2pi
        # contract: a non-positive std makes its element NaN, never a silent +-inf or a floor
        elem = tl.where(std > 0, elem, float("nan"))
        if REDUCE == _NONE:
            tl.store(out_ptr + offs, elem, mask=ok)
        else:
            total += tl.sum(tl.where(ok, elem, 0.0), axis=1)
    if REDUCE != _NONE:
        if REDUCE == _MEAN:
            total = total / C
        tl.store(out_ptr + rows.to(tl.int64), total, mask=row_ok)


@triton.jit(do_not_specialize=["R"])
def _gaussian_logprob_bwd_kernel(
    grad_ptr,
    x_ptr,
    mean_ptr,
    std_ptr,
    grad_x_ptr,
    grad_mean_ptr,
    grad_std_ptr,
    R,
    C,
    REDUCE: tl.constexpr,
    STD_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    dt = grad_x_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    if REDUCE != _NONE:
        # d(sum)/d(elem) = 1, d(mean)/d(elem) = 1/C: one upstream value per row
        grad_row = tl.load(grad_ptr + rows.to(tl.int64), mask=row_ok, other=0.0).to(dt)
        if REDUCE == _MEAN:
            grad_row = grad_row / C
    if STD_PER_ROW:
        std_row = tl.load(std_ptr + rows.to(tl.int64), mask=row_ok, other=1.0).to(dt)
        grad_std_row = tl.zeros([BLOCK_R], dtype=dt)
    for c0 in range(0, C, BLOCK_C):
        offs, ok = _tile(rows, c0, R, C, BLOCK_C)
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(dt)
        mean = tl.load(mean_ptr + offs, mask=ok, other=0.0).to(dt)
        if STD_PER_ROW:
            std = std_row[:, None]
        else:
            std = tl.load(std_ptr + offs, mask=ok, other=1.0).to(dt)
        if REDUCE == _NONE:
            grad = tl.load(grad_ptr + offs, mask=ok, other=0.0).to(dt)
        else:
            grad = grad_row[:, None]
        diff = x - mean
        inv_var = 1.0 / (std * std)
        grad_x = -grad * diff * inv_var
        tl.store(grad_x_ptr + offs, grad_x, mask=ok)
        tl.store(grad_mean_ptr + offs, -grad_x, mask=ok)
        grad_std = grad * (diff * diff * inv_var - 1.0) / std
        if STD_PER_ROW:
            grad_std_row += tl.sum(tl.where(ok, grad_std, 0.0), axis=1)
        else:
            tl.store(grad_std_ptr + offs, grad_std, mask=ok)
    if STD_PER_ROW:
        tl.store(grad_std_ptr + rows.to(tl.int64), grad_std_row, mask=row_ok)


def _check(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int) -> bool:
    """Validates the layout; returns True when std is per row (S == 1)."""
    for name, t in (("x", x), ("mean", mean), ("std", std)):
        require_contiguous(name, t, 2)
    if mean.shape != x.shape:
        raise ValueError(f"mean: expected shape {tuple(x.shape)} (as x), got {tuple(mean.shape)}")
    R, C = x.shape
    if std.shape[0] != R or std.shape[1] not in (1, C):
        raise ValueError(f"std: expected shape ({R}, 1) or ({R}, {C}), got {tuple(std.shape)}")
    if reduce not in (REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN):
        raise ValueError(f"reduce: expected {REDUCE_NONE} (none), {REDUCE_SUM} (sum) or {REDUCE_MEAN} (mean), got {reduce!r}")
    return std.shape[1] == 1


def _blocks(R: int, C: int) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(max(C, 1)), MAX_BLOCK_C)
    block_r = programs_block(R, max_block=max(1, 2048 // block_c), min_block=max(1, 256 // block_c))
    return block_r, block_c


def gaussian_logprob_fwd(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int) -> torch.Tensor:
    """log N(x; mean, std^2) per element of x [R, C], std [R, C] or [R, 1].

    Returns [R, C] for reduce none, else [R] (sum or mean over C), fp32 (fp64 for fp64 x).
    An element whose std <= 0 is NaN (and so is its row's sum or mean).
    """
    per_row = _check(x, mean, std, reduce)
    R, C = x.shape
    out_shape = (R, C) if reduce == REDUCE_NONE else (R,)
    out = torch.empty(out_shape, dtype=acc_dtype(x.dtype), device=x.device)
    if out.numel() == 0:
        return out  # with C == 0 and R > 0 the kernel still runs: empty sum 0, empty mean NaN
    block_r, block_c = _blocks(R, C)
    _gaussian_logprob_fwd_kernel[(triton.cdiv(R, block_r),)](
        x,
        mean,
        std,
        out,
        R,
        C,
        REDUCE=reduce,
        STD_PER_ROW=per_row,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=warps_for(block_r * block_c),
    )
    return out


def gaussian_logprob_bwd(
    grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of gaussian_logprob_fwd in one pass: (grad_x [R, C], grad_mean [R, C], grad_std [R, S]).

    grad_out is [R, C] for reduce none, else [R]. A per-row std (S == 1) gets its gradient summed
    over the channels. Outputs fp32 (fp64 for fp64 x).
    """
    per_row = _check(x, mean, std, reduce)
    require_contiguous("grad_out", grad_out, 2 if reduce == REDUCE_NONE else 1)
    R, C = x.shape
    expected = (R, C) if reduce == REDUCE_NONE else (R,)
    if tuple(grad_out.shape) != expected:
        raise ValueError(f"grad_out: expected shape {expected}, got {tuple(grad_out.shape)}")
    dt = acc_dtype(x.dtype)
    grad_x = torch.empty((R, C), dtype=dt, device=x.device)
    grad_mean = torch.empty((R, C), dtype=dt, device=x.device)
    grad_std = torch.empty(tuple(std.shape), dtype=dt, device=x.device)
    if R == 0 or C == 0:
        return grad_x, grad_mean, grad_std.zero_()
    block_r, block_c = _blocks(R, C)
    _gaussian_logprob_bwd_kernel[(triton.cdiv(R, block_r),)](
        grad_out,
        x,
        mean,
        std,
        grad_x,
        grad_mean,
        grad_std,
        R,
        C,
        REDUCE=reduce,
        STD_PER_ROW=per_row,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=warps_for(block_r * block_c),
    )
    return grad_x, grad_mean, grad_std
