"""The eager oracle of every fused op: plain PyTorch at the kernel level (the `torch` backend).

These functions are the contract that every backend (triton, cuda, cpp) matches: same arguments,
same layouts, same outputs. The public ops (margrpo.ops.*) validate and normalise user input into
these layouts, then dispatch. Inputs here are already validated, contiguous and 2-D/3-D as stated.

Numerics: fp32 accumulation and fp32 outputs for fp16/bf16/fp32 inputs; fp64 stays fp64 (tests).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._validate import broadcast_shape

REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN = 0, 1, 2
AGG_TOKEN_MEAN, AGG_SAMPLE_MEAN = 0, 1
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# log-ratios are clamped to this range before exp so a wild step cannot overflow the ratio to inf
MAX_LOG_RATIO = 20.0


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation/output dtype: float64 stays float64, every other float type computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- gaussian log-prob
def gaussian_logprob_fwd(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int) -> torch.Tensor:
    """x, mean: [R, C]; std: [R, C] or [R, 1] (already broadcast per row). -> [R, C] (none) or [R].

    Per element: -0.5 ((x - mean) / std)^2 - log(std) - 0.5 log(2 pi). Kernel policy for std <= 0:
    the element is NaN (never -inf/inf, never floored), so a bad std is visible, not silent.
    """
    dt = acc_dtype(x.dtype)
    x, mean, std = x.to(dt), mean.to(dt), std.to(dt)
    z = (x - mean) / std
    elem = -0.5 * z * z - torch.log(std) - LOG_SQRT_2PI
    elem = torch.where(std > 0, elem, torch.full_like(elem, float("nan")))
    if reduce == REDUCE_NONE:
        return elem
    return elem.sum(-1) if reduce == REDUCE_SUM else elem.mean(-1)


def gaussian_logprob_bwd(grad_out, x, mean, std, reduce: int):
    """Gradients of gaussian_logprob_fwd. -> (grad_x [R, C], grad_mean [R, C], grad_std [R, S]),
    S = std.shape[1] (per-row std gets its gradient summed over channels). acc dtype."""
    dt = acc_dtype(x.dtype)
    x, mean, std, g = x.to(dt), mean.to(dt), std.to(dt), grad_out.to(dt)
    C = x.shape[-1]
    if reduce == REDUCE_NONE:
        ge = g
    else:
        ge = g.unsqueeze(-1) / (C if reduce == REDUCE_MEAN else 1)
    diff = x - mean
    inv_var = 1.0 / (std * std)
    grad_x = -ge * diff * inv_var
    grad_mean = -grad_x
    grad_std = ge * (diff * diff * inv_var - 1.0) / std
    if std.shape[-1] == 1 and C != 1:
        grad_std = grad_std.sum(-1, keepdim=True)
    return grad_x.expand_as(x).contiguous(), grad_mean.expand_as(x).contiguous(), grad_std.contiguous()


# ---------------------------------------------------------------- trajectory std
def trajectory_std_fwd(samples: torch.Tensor) -> torch.Tensor:
    """samples [K, M, C], K >= 2 -> [M]: population std over K (unbiased=False), then mean over C.

    Computed on the differences from trajectory 0 (the std does not change), which are exact for
    nearby values: with a large offset and a small spread (1e5 and 1e-2) torch.std of the samples
    themselves is off by 2e-10 relative even in float64."""
    s = samples.to(acc_dtype(samples.dtype))
    return (s - s[:1]).std(dim=0, unbiased=False).mean(-1)


def trajectory_std_bwd(grad_out: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """d/d samples of trajectory_std_fwd. Where the std over K is 0 the gradient is defined as 0."""
    s = samples.to(acc_dtype(samples.dtype))
    s = s - s[:1]  # as in the forward: exact differences keep a large offset out of the centring
    K, C = s.shape[0], s.shape[-1]
    centered = s - s.mean(0, keepdim=True)
    std = centered.pow(2).mean(0, keepdim=True).sqrt()
    safe = torch.where(std > 0, std, torch.ones_like(std))
    grad = centered / (K * safe) * (std > 0)
    return grad * (grad_out.to(s.dtype)[None, :, None] / C)


# ---------------------------------------------------------------- top-k
def topk_indices_fwd(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, N] (no NaN), 0 <= k <= N -> int64 [B, k]: positions of the k largest scores per row,
    ordered by descending score; equal scores are ordered (and chosen) toward the lower index."""
    B, N = scores.shape
    # a stable descending sort keeps equal scores in index order: ties go to the lower index
    order = torch.sort(scores.to(acc_dtype(scores.dtype)), dim=-1, descending=True, stable=True).indices
    return order[:, :k].contiguous()


def topk_mask_fwd(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, N] -> bool [B, N] with exactly k True per row (the positions of topk_indices_fwd)."""
    mask = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    return mask.scatter_(1, topk_indices_fwd(scores, k), True)


# ---------------------------------------------------------------- consistency
def cosine_or_zero(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity over the last dim, defined as 0 when either vector has zero norm."""
    dot = (a * b).sum(-1)
    norm2 = (a * a).sum(-1) * (b * b).sum(-1)
    return torch.where(norm2 > 0, dot / norm2.clamp_min(torch.finfo(dot.dtype).tiny).sqrt(), torch.zeros_like(dot))


def consistency_mask_fwd(prev, cur, final, threshold: float) -> torch.Tensor:
    """prev, cur, final: [M, C] -> bool [M]: cos(cur, final) - cos(prev, final) > threshold."""
    dt = acc_dtype(cur.dtype)
    prev, cur, final = prev.to(dt), cur.to(dt), final.to(dt)
    return (cosine_or_zero(cur, final) - cosine_or_zero(prev, final)) > threshold


# ---------------------------------------------------------------- clipped GRPO surrogate
def grpo_surrogate_fwd(logp, old_logp, advantages, weights, mte_mask, clip_low: float, clip_high: float):
    """The clipped PPO/GRPO objective with its gradient, in one pass.

    logp, old_logp: [T, B, L] (trajectory 0 is the rollout's own; 1.. are extra seed trajectories),
    advantages: [B]; weights: [B, L] float, the normalised token weights (sum to 1 over kept tokens,
    built by the public op from the mask and the aggregation); mte_mask: [B, L] bool: where True the
    token's term is the mean over all T trajectories, elsewhere trajectory 0 alone.

    Per trajectory and token: r = exp(clamp(logp - old, +-MAX_LOG_RATIO));
    term = max(-A r, -A clamp(r, 1 - clip_low, 1 + clip_high)).
    Returns (loss [], stats [4] = (clip_fraction, approx_kl, ratio_mean, ratio_max), grad [T, B, L]):
    loss = sum_t,b,l w * tw * term, where tw = 1/T on mte tokens, else 1 for t = 0 and 0 otherwise;
    grad = d loss / d logp; clip_fraction = weighted share of terms whose gradient is clipped to 0;
    approx_kl = weighted mean of (r - 1) - log r (k3); ratio_mean weighted; ratio_max over kept terms
    (weight > 0), 1 when none is kept.
    """
    dt = acc_dtype(logp.dtype)
    T = logp.shape[0]
    log_ratio = (logp.to(dt) - old_logp.to(dt)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(dt)[None, :, None]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    term = torch.maximum(unclipped, clipped)
    # the gradient is zero where the clipped branch is strictly the larger one
    is_clipped = clipped > unclipped
    first = torch.zeros((T, 1, 1), dtype=dt, device=logp.device)
    first[0] = 1.0
    traj_w = torch.where(mte_mask[None], torch.full_like(first, 1.0 / T), first)
    w = weights.to(dt)[None] * traj_w
    loss = (w * term).sum()
    grad = torch.where(is_clipped, torch.zeros_like(ratio), w * unclipped)  # d(-A r)/dlogp = -A r
    kept = w > 0
    ratio_max = ratio[kept].max() if bool(kept.any()) else torch.ones((), dtype=dt, device=logp.device)
    stats = torch.stack(
        [
            (w * is_clipped).sum(),
            (w * (ratio - 1.0 - log_ratio)).sum(),
            (w * ratio).sum(),
            ratio_max,
        ]
    )
    return loss, stats, grad


# ---------------------------------------------------------------- adaLN modulation (diffusion heads)
# Unlike the kernels above these take the heads' strided, broadcasting views as they are (a copy
# would cost more than the op) and compute in the input dtype, as the official heads' LayerNorm does.
# They are differentiable by PyTorch's autograd: the ops' torch backend in training too.
def ln_modulate_fwd(x, shift, scale, weight, bias, eps: float) -> torch.Tensor:
    """LayerNorm(x; weight, bias, eps) * (1 + scale) + shift; x [*Lx, N, W], shift/scale [*Lm, N, W]
    broadcast over the leading dims (the seed trajectories), weight/bias [W] or None."""
    normed = F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return torch.addcmul(shift, normed, 1 + scale)


def gate_residual_fwd(residual, h, gate, weight, bias, eps: float, in_place: bool) -> torch.Tensor:
    """residual + gate * h, or residual + gate * LayerNorm(h; weight, bias, eps) when weight is given.

    in_place: with grad mode off, `residual` (the head's running hidden state, dead after this
    update) is overwritten when it already has the broadcast shape, so no new buffer is needed.
    """
    in_place = (
        in_place
        and not torch.is_grad_enabled()
        and residual.is_contiguous()
        and residual.shape == broadcast_shape(residual=residual.shape, h=h.shape, gate=gate.shape)
    )
    if weight is not None:
        h = F.layer_norm(h, h.shape[-1:], weight, bias, eps)
    return residual.addcmul_(gate, h) if in_place else torch.addcmul(residual, gate, h)
