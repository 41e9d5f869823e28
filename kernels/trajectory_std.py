"""Triton kernels for the uncertainty of a token: std over K seed trajectories, mean over channels.

samples [K, M, C] with K small (2..8). A program loads a [BLOCK_K, BLOCK_M, BLOCK_C] tile, so all K
values of an element sit in registers: the mean and then the squared deviations are two reductions
over the register axis K (two-pass numerics, one read of memory), both on the differences from
trajectory 0's value, so that a large offset (latents at 1e5, spread 1e-2) does not drown the spread
in the rounding of the mean. Channels are walked in BLOCK_C
chunks and the per-channel std summed, then divided by C. Math runs in the output dtype (fp32, or
fp64 for fp64 samples).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._util import acc_dtype, programs_block, require_contiguous, warps_for

MAX_BLOCK_C = 64


@triton.jit
def _load_centered(samples_ptr, rows, c0, K, M, C, dt: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):
    """Loads the tile at channel c0 and returns (offsets, mask, samples - mean over K, std over K)."""
    ks = tl.arange(0, BLOCK_K)
    cols = c0 + tl.arange(0, BLOCK_C)
    ok = (ks < K)[:, None, None] & (rows < M)[None, :, None] & (cols < C)[None, None, :]
    offs = (ks.to(tl.int64)[:, None, None] * M + rows.to(tl.int64)[None, :, None]) * C + cols[None, None, :]
    s = tl.load(samples_ptr + offs, mask=ok, other=0.0).to(dt)
    shift = tl.sum(tl.where((ks == 0)[:, None, None], s, 0.0), axis=0)  # trajectory 0, already in registers
    diff = tl.where(ok, s - shift[None, :, :], 0.0)
    mean = tl.sum(diff, axis=0) / K
    centered = tl.where(ok, diff - mean[None, :, :], 0.0)
    std = tl.sqrt(tl.sum(centered * centered, axis=0) / K)  # population std (unbiased=False)
    return offs, ok, centered, std


@triton.jit(do_not_specialize=["M"])
def _trajectory_std_fwd_kernel(
    samples_ptr,
    out_ptr,
    K,
    M,
    C,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    dt = out_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    total = tl.zeros([BLOCK_M], dtype=dt)
    for c0 in range(0, C, BLOCK_C):
        # out-of-bounds rows/channels load zeros, so their std is 0 and adds nothing
        _, _, _, std = _load_centered(samples_ptr, rows, c0, K, M, C, dt, BLOCK_K, BLOCK_C)
        total += tl.sum(std, axis=1)
    tl.store(out_ptr + rows.to(tl.int64), total / C, mask=rows < M)


@triton.jit(do_not_specialize=["M"])
def _trajectory_std_bwd_kernel(
    grad_out_ptr,
    samples_ptr,
    grad_ptr,
    K,
    M,
    C,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    dt = grad_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    # d out[m] / d std[m, c] = 1 / C
    g = tl.load(grad_out_ptr + rows.to(tl.int64), mask=rows < M, other=0.0).to(dt) / C
    for c0 in range(0, C, BLOCK_C):
        offs, ok, centered, std = _load_centered(samples_ptr, rows, c0, K, M, C, dt, BLOCK_K, BLOCK_C)
        # d std / d s_k = (s_k - mean) / (K std); defined as 0 where the std is 0 (contract)
        safe_std = tl.where(std > 0, std, 1.0)
        scale = tl.where(std > 0, g[:, None] / (K * safe_std), 0.0)
        tl.store(grad_ptr + offs, centered * scale[None, :, :], mask=ok)


def _blocks(K: int, M: int, C: int) -> tuple[int, int, int]:
    block_k = triton.next_power_of_2(K)
    block_c = min(triton.next_power_of_2(max(C, 1)), MAX_BLOCK_C)
    per_row = block_k * block_c
    block_m = programs_block(M, max_block=max(1, 2048 // per_row), min_block=max(1, 256 // per_row))
    return block_k, block_m, block_c


def _check(samples: torch.Tensor) -> None:
    require_contiguous("samples", samples, 3)
    if samples.shape[0] < 1:
        raise ValueError(f"samples: expected K >= 1 trajectories on dim 0, got shape {tuple(samples.shape)}")


def trajectory_std_fwd(samples: torch.Tensor) -> torch.Tensor:
    """samples [K, M, C] -> [M]: population std over K, then mean over C. fp32 (fp64 for fp64)."""
    _check(samples)
    K, M, C = samples.shape
    out = torch.empty((M,), dtype=acc_dtype(samples.dtype), device=samples.device)
    if M == 0:
        return out
    if C == 0:
        return out.fill_(float("nan"))  # mean over zero channels, as torch's empty mean
    block_k, block_m, block_c = _blocks(K, M, C)
    _trajectory_std_fwd_kernel[(triton.cdiv(M, block_m),)](
        samples,
        out,
        K,
        M,
        C,
        BLOCK_K=block_k,
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        num_warps=warps_for(block_k * block_m * block_c),
    )
    return out


def trajectory_std_bwd(grad_out: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """d/d samples of trajectory_std_fwd: grad_out [M] -> [K, M, C]; 0 where the std over K is 0."""
    _check(samples)
    K, M, C = samples.shape
    require_contiguous("grad_out", grad_out, 1)
    if grad_out.shape[0] != M:
        raise ValueError(f"grad_out: expected shape ({M},) to match samples {tuple(samples.shape)}, got {tuple(grad_out.shape)}")
    grad = torch.empty((K, M, C), dtype=acc_dtype(samples.dtype), device=samples.device)
    if grad.numel() == 0:
        return grad
    block_k, block_m, block_c = _blocks(K, M, C)
    _trajectory_std_bwd_kernel[(triton.cdiv(M, block_m),)](
        grad_out,
        samples,
        grad,
        K,
        M,
        C,
        BLOCK_K=block_k,
        BLOCK_M=block_m,
        BLOCK_C=block_c,
        num_warps=warps_for(block_k * block_m * block_c),
    )
    return grad
