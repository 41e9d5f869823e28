"""Triton kernels of the fused clipped GRPO surrogate: loss, gradient and statistics in one pass.

Layout: logp, old_logp [T, B, L] (T trajectories: 0 is the rollout's own, 1.. the extra MTE seeds),
advantages [B], weights [B, L], mte_mask bool [B, L]. A program owns BLOCK tokens of the flattened
B*L axis and walks the T trajectories, so every load is a contiguous run and the token's advantage,
weight and mask are read once for all trajectories. It writes the per-element gradient and one
partial sum per statistic; a one-program kernel then reduces the partials in a fixed order, so the
loss and the statistics are deterministic (no atomics).

Numerics: fp32 (fp64 for fp64 logp). The clip bounds 1 - clip_low and 1 + clip_high are computed in
Python and reach the kernel as fp32 scalars (Triton types Python floats as fp32), so with fp64 inputs
they are rounded to fp32. NaN log-probs propagate to the loss, gradient and ratio statistics as in
the oracle (clamps are written with tl.where, which keeps NaN, unlike min/max).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from margrpo.ops.oracle import MAX_LOG_RATIO

from ._util import acc_dtype, programs_block, require_contiguous, warps_for

_MAX_LOG_RATIO = tl.constexpr(MAX_LOG_RATIO)
# rows of the partials buffer, one per reduced quantity
_LOSS, _CLIP, _KL, _RATIO_SUM, _RATIO_MAX = 0, 1, 2, 3, 4
N_PARTIALS = 5
MAX_FINALIZE_BLOCK = 1024


@triton.jit
def _max_keep_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _reduce_max_keep_nan(x):
    """Max of a 1-D block that is NaN when any element is (tl.max may skip NaN)."""
    has_nan = tl.sum((x != x).to(tl.int32), axis=0) > 0
    return tl.where(has_nan, float("nan"), tl.max(x, axis=0))


@triton.jit
def _clamp_keep_nan(x, lo, hi):
    return tl.where(x < lo, lo, tl.where(x > hi, hi, x))


@triton.jit
def _grpo_surrogate_kernel(
    logp_ptr,
    old_logp_ptr,
    adv_ptr,
    weights_ptr,
    mte_ptr,
    grad_ptr,
    partials_ptr,
    T,
    L,
    BL,
    ratio_low,
    ratio_high,
    BLOCK: tl.constexpr,
):
    dt = grad_ptr.dtype.element_ty
    pid = tl.program_id(0)
    tokens = pid * BLOCK + tl.arange(0, BLOCK)
    ok = tokens < BL
    tokens = tokens.to(tl.int64)
    adv = tl.load(adv_ptr + tokens // L, mask=ok, other=0.0).to(dt)
    token_w = tl.load(weights_ptr + tokens, mask=ok, other=0.0).to(dt)
    mte = tl.load(mte_ptr + tokens, mask=ok, other=0) != 0
    inv_t = tl.full([], 1.0, dt) / T  # in the compute dtype, so fp64 keeps 1/T exact
    loss = tl.zeros([BLOCK], dtype=dt)
    clip = tl.zeros([BLOCK], dtype=dt)
    kl = tl.zeros([BLOCK], dtype=dt)
    ratio_sum = tl.zeros([BLOCK], dtype=dt)
    ratio_max = tl.full([BLOCK], float("-inf"), dt)
    for t in range(T):
        offs = t * BL + tokens
        logp = tl.load(logp_ptr + offs, mask=ok, other=0.0).to(dt)
        old = tl.load(old_logp_ptr + offs, mask=ok, other=0.0).to(dt)
        log_ratio = _clamp_keep_nan(logp - old, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        ratio = tl.exp(log_ratio)
        unclipped = -adv * ratio
        clipped = -adv * _clamp_keep_nan(ratio, ratio_low, ratio_high)
        # the gradient is zero where the clipped branch is strictly the larger one
        is_clipped = clipped > unclipped
        term = tl.where(is_clipped, clipped, unclipped)
        # MTE tokens average all T trajectories; the others use trajectory 0 alone
        traj_w = tl.where(mte, inv_t, tl.where(t == 0, 1.0, 0.0))
        w = token_w * traj_w
        tl.store(grad_ptr + offs, tl.where(is_clipped, 0.0, w * unclipped), mask=ok)
        loss += tl.where(ok, w * term, 0.0)
        clip += tl.where(ok & is_clipped, w, 0.0)
        kl += tl.where(ok, w * (ratio - 1.0 - log_ratio), 0.0)
        ratio_sum += tl.where(ok, w * ratio, 0.0)
        kept = ok & (w > 0)
        ratio_max = _max_keep_nan(ratio_max, tl.where(kept, ratio, float("-inf")))
    n = tl.num_programs(0)
    tl.store(partials_ptr + 0 * n + pid, tl.sum(loss, axis=0))
    tl.store(partials_ptr + 1 * n + pid, tl.sum(clip, axis=0))
    tl.store(partials_ptr + 2 * n + pid, tl.sum(kl, axis=0))
    tl.store(partials_ptr + 3 * n + pid, tl.sum(ratio_sum, axis=0))
    tl.store(partials_ptr + 4 * n + pid, _reduce_max_keep_nan(ratio_max))


@triton.jit
def _grpo_finalize_kernel(partials_ptr, loss_ptr, stats_ptr, n, BLOCK: tl.constexpr):
    """Sums the per-program partials in a fixed order; ratio_max is 1 when no term was kept."""
    dt = loss_ptr.dtype.element_ty
    loss = tl.zeros([BLOCK], dtype=dt)
    clip = tl.zeros([BLOCK], dtype=dt)
    kl = tl.zeros([BLOCK], dtype=dt)
    ratio_sum = tl.zeros([BLOCK], dtype=dt)
    ratio_max = tl.full([BLOCK], float("-inf"), dt)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        ok = idx < n
        loss += tl.load(partials_ptr + 0 * n + idx, mask=ok, other=0.0)
        clip += tl.load(partials_ptr + 1 * n + idx, mask=ok, other=0.0)
        kl += tl.load(partials_ptr + 2 * n + idx, mask=ok, other=0.0)
        ratio_sum += tl.load(partials_ptr + 3 * n + idx, mask=ok, other=0.0)
        ratio_max = _max_keep_nan(ratio_max, tl.load(partials_ptr + 4 * n + idx, mask=ok, other=float("-inf")))
    tl.store(loss_ptr, tl.sum(loss, axis=0))
    tl.store(stats_ptr + 0, tl.sum(clip, axis=0))
    tl.store(stats_ptr + 1, tl.sum(kl, axis=0))
    tl.store(stats_ptr + 2, tl.sum(ratio_sum, axis=0))
    best = _reduce_max_keep_nan(ratio_max)
    tl.store(stats_ptr + 3, tl.where(best == float("-inf"), 1.0, best))


def _check(logp, old_logp, advantages, weights, mte_mask) -> None:
    require_contiguous("logp", logp, 3)
    T, B, L = logp.shape
    if T < 1:
        raise ValueError(f"logp: expected T >= 1 trajectories on dim 0, got shape {tuple(logp.shape)}")
    expected = {
        "old_logp": (old_logp, 3, (T, B, L)),
        "advantages": (advantages, 1, (B,)),
        "weights": (weights, 2, (B, L)),
        "mte_mask": (mte_mask, 2, (B, L)),
    }
    for name, (t, ndim, shape) in expected.items():
        require_contiguous(name, t, ndim)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape} to match logp {tuple(logp.shape)}, got {tuple(t.shape)}")
    if mte_mask.dtype != torch.bool:
        raise ValueError(f"mte_mask: expected dtype torch.bool, got {mte_mask.dtype}")


def _block(BL: int) -> int:
    return programs_block(BL, max_block=1024)


def grpo_surrogate_fwd(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    mte_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped GRPO surrogate and its gradient in one pass (semantics: oracle.grpo_surrogate_fwd).

    Returns (loss [], stats [4] = (clip_fraction, approx_kl, ratio_mean, ratio_max), grad [T, B, L]
    = d loss / d logp), fp32 (fp64 for fp64 logp).
    """
    _check(logp, old_logp, advantages, weights, mte_mask)
    T, B, L = logp.shape
    dt = acc_dtype(logp.dtype)
    grad = torch.empty((T, B, L), dtype=dt, device=logp.device)
    loss = torch.empty((), dtype=dt, device=logp.device)
    stats = torch.empty((4,), dtype=dt, device=logp.device)
    BL = B * L
    block = _block(BL)
    n_programs = triton.cdiv(BL, block)
    partials = torch.empty((N_PARTIALS, n_programs), dtype=dt, device=logp.device)
    if n_programs > 0:
        _grpo_surrogate_kernel[(n_programs,)](
            logp,
            old_logp,
            advantages,
            weights,
            mte_mask,
            grad,
            partials,
            T,
            L,
            BL,
            1.0 - clip_low,
            1.0 + clip_high,
            BLOCK=block,
            num_warps=warps_for(block),
        )
    finalize_block = min(triton.next_power_of_2(max(n_programs, 1)), MAX_FINALIZE_BLOCK)
    _grpo_finalize_kernel[(1,)](partials, loss, stats, n_programs, BLOCK=finalize_block, num_warps=warps_for(finalize_block))
    return loss, stats, grad
