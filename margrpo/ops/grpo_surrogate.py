"""grpo_surrogate: the clipped PPO/GRPO policy loss, its statistics and its gradient in one pass.

For every trajectory t, sample b and token l: r = exp(logp - old_logp) (log-ratio clamped to
+-20), term = max(-A_b r, -A_b clamp(r, 1 - clip_eps, 1 + clip_eps_high)). Tokens selected by
mte_mask average the term over all T trajectories (multi-trajectory expectation); the others use
trajectory 0 (the rollout's own). The loss is a weighted sum of terms whose weights this module
builds from the mask and the aggregation. The kernel returns d loss / d logp alongside the loss;
backward only scales it by the incoming gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _kernels, _validate, oracle
from ._factory import FusedOp, Gradient

_MODULE = "grpo_surrogate"
_KERNELS = ("grpo_surrogate_fwd",)
_AGGREGATIONS = ("token_mean", "sample_mean", "sum")


STATISTICS = ("clip_fraction", "approx_kl", "ratio_mean", "ratio_max")


class GRPOLoss(NamedTuple):
    """The loss (0-d, the only differentiable output, with respect to logp) and its statistics as one
    tensor [4] in the order of STATISTICS (one tensor: splitting it into four 0-d tensors on every call
    cost about 1.5 us, a tenth of the kernel at the NOVA shape); each is also a property (a 0-d view)."""

    loss: torch.Tensor
    stats: torch.Tensor

    @property
    def clip_fraction(self) -> torch.Tensor:
        """Weighted share of terms whose gradient the clip zeroes."""
        return self.stats[0]

    @property
    def approx_kl(self) -> torch.Tensor:
        """Weighted mean of the k3 estimator (r - 1) - log r."""
        return self.stats[1]

    @property
    def ratio_mean(self) -> torch.Tensor:
        """Weighted mean ratio (0 when no token is kept)."""
        return self.stats[2]

    @property
    def ratio_max(self) -> torch.Tensor:
        """Max ratio over kept terms (1 when no token is kept)."""
        return self.stats[3]


def _fake(logp, old_logp, advantages, weights, mte_mask, clip_low, clip_high):
    dt = oracle.acc_dtype(logp.dtype)
    return logp.new_empty((), dtype=dt), logp.new_empty((4,), dtype=dt), logp.new_empty(logp.shape, dtype=dt)


def _backward(run, saved, attrs, grad_loss, grad_stats, grad_grad):
    (grad,) = saved  # d loss / d logp, from the forward kernel
    return grad * grad_loss, None, None, None, None, None, None


_OP = FusedOp(
    "grpo_surrogate",
    _MODULE,
    _KERNELS,
    "(Tensor logp, Tensor old_logp, Tensor advantages, Tensor weights, Tensor mte_mask, float clip_low, "
    "float clip_high, str backend) -> (Tensor, Tensor, Tensor)",
    None,  # forward: the kernel itself
    _fake,
    Gradient(lambda inputs, outputs: ((outputs[2],), ()), _backward, non_differentiable=(1, 2)),
)


def token_weights(mask: torch.Tensor, aggregation: str = "token_mean", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Token weights [B, L] in `dtype` from a mask [B, L] (bool, or non-negative float weights).

    token_mean: every kept token weighs the same; sample_mean: each sample that keeps any token
    weighs the same, split evenly over its kept tokens. Either sums to 1 over the batch (all 0 when
    nothing is kept), so a loss may be evaluated chunk by chunk with aggregation "sum" on slices of
    these weights and the chunk losses add up to the batch loss. "sum": the mask itself, as weights.
    """
    _validate.choice("aggregation", aggregation, _AGGREGATIONS)
    if aggregation == "token_mean" and mask.dtype == torch.bool and mask.device.type == "cpu" and _kernels.direct_call_allowed():
        # eager on the CPU, reading the count costs no sync: one op fewer than dividing by a clamped
        # tensor (not while tracing or under a dispatch mode: fake tensors have no count to read)
        return mask.to(dtype).div_(max(int(mask.sum()), 1))
    w = mask if mask.dtype == dtype else mask.to(dtype)  # a no-op .to() still costs about 1.5 us
    if aggregation == "sum":
        return w
    if aggregation == "token_mean":
        total = w.sum()
        # a bool mask sums to a count, so clamping it at 1 only replaces an empty mask's 0
        return w / (total.clamp_min(1.0) if mask.dtype == torch.bool else torch.where(total > 0, total, 1.0))
    per_sample = w.sum(1, keepdim=True)
    kept = per_sample > 0
    samples_kept = kept.sum().clamp_min(1).to(dtype)
    return torch.where(kept, w / torch.where(kept, per_sample, 1.0), 0.0) / samples_kept


def grpo_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    mte_mask: torch.Tensor | None = None,
    aggregation: str = "token_mean",
    *,
    check_finite: bool = True,
) -> GRPOLoss:
    """The clipped GRPO policy loss (to minimise) with its diagnostics.

    Args:
        logp: [B, L] or [T, B, L] per-token log-probs under the current policy (differentiable);
            with T trajectories, index 0 is the rollout's own and 1.. are extra seed trajectories.
        old_logp: same shape, the log-probs at rollout time (no gradient).
        advantages: [B], one advantage per sample.
        mask: [B, L] bool (kept tokens) or float (non-negative token weights).
        clip_eps, clip_eps_high: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high];
            clip_eps_high defaults to clip_eps (asymmetric "clip-higher" when given).
        mte_mask: [B, L] bool or None: where True, the token's term is the mean over all T
            trajectories; elsewhere (and when None) trajectory 0 alone.
        aggregation: "token_mean": sum(w * term) / sum(w) over the whole batch; "sample_mean":
            each sample's masked mean, then the mean over samples that keep any token; "sum":
            sum(w * term), the mask taken as final weights (e.g. `token_weights` of a whole batch,
            sliced into chunks: the chunk losses then add up to the batch loss).
        check_finite: raise ValueError on NaN or infinite advantages (eager CPU calls only, where
            it costs no host sync; a caller that checked them already turns it off).

    Returns:
        GRPOLoss of 0-d float32 tensors (float64 for float64 logp); the loss is 0, ratio_mean 0 and
        ratio_max 1 when no token is kept. Gradients flow to logp only.
    """
    key = plan = None
    if not torch.compiler.is_compiling():
        try:
            # clip_eps and clip_eps_high are in the key with their types, so a repeated call skips
            # their checks too (a NaN never equals itself: it is checked, and rejected, every time)
            key = (
                _validate.signature(logp, old_logp, advantages, mask, mte_mask),
                aggregation,
                type(clip_eps),
                clip_eps,
                type(clip_eps_high),
                clip_eps_high,
            )
            plan = _PLANS.get(key)
        except (AttributeError, TypeError):  # an argument that is no tensor (the checks name it)
            key = None
    if plan is None:
        plan = _plan(logp, old_logp, advantages, mask, mte_mask, aggregation, clip_eps, clip_eps_high)
        _validate.remember(_PLANS, key, plan)
    B, L, dtype, device, clip_low, clip_high, ready, empty = plan
    if check_finite and device.type == "cpu" and _kernels.direct_call_allowed():  # free here; on a GPU a host sync
        _validate.all_finite("advantages", advantages, "(a NaN reward, or advantages of an empty group?)")
    if ready:  # the tensors are the kernels' operands as they are (the trainer's call)
        mte = _all_false(B, L, device) if mte_mask is None else mte_mask
        inputs = (logp, old_logp, advantages, mask, mte, clip_low, clip_high)
    else:
        # these tensors are small ([T, B, L]): computing all of them in the accumulation dtype keeps
        # the kernels to one dtype per call
        operand = _kernels.operand
        inputs = (
            operand(logp if logp.ndim == 3 else logp.unsqueeze(0), dtype),
            operand(_constant(old_logp if old_logp.ndim == 3 else old_logp.unsqueeze(0)), dtype),
            operand(_constant(advantages), dtype),
            token_weights(_constant(mask), aggregation, dtype).contiguous(),
            _all_false(B, L, device) if mte_mask is None else mte_mask.contiguous(),
            clip_low,
            clip_high,
        )
    loss, stats, _ = _OP.run(device, inputs, empty)
    return GRPOLoss(loss, stats)


_PLANS: dict[tuple, tuple] = {}  # call signature -> _plan's result; see _validate.remember
_ALL_FALSE: dict[tuple, torch.Tensor] = {}  # (B, L, device) -> the mte_mask of eager calls without one


def _all_false(B: int, L: int, device: torch.device) -> torch.Tensor:
    """The all-False mte_mask of a call without one: the kernels only read it, so eager calls share one
    per shape; under tracing or a dispatch mode (fake tensors) a fresh one of that mode."""
    if not _kernels.direct_call_allowed():
        return torch.zeros((B, L), dtype=torch.bool, device=device)
    mask = _ALL_FALSE.get((B, L, device))
    if mask is None:
        mask = torch.zeros((B, L), dtype=torch.bool, device=device)
        _validate.remember(_ALL_FALSE, (B, L, device), mask)
    return mask


def _constant(t: torch.Tensor) -> torch.Tensor:
    """`t` outside autograd: detached only when it records (a detach costs about 0.3 us a call)."""
    return t.detach() if t.requires_grad else t


def _plan(
    logp: object,
    old_logp: object,
    advantages: object,
    mask: object,
    mte_mask: object,
    aggregation: object,
    clip_eps: object,
    clip_eps_high: object,
) -> tuple:
    """Every check of grpo_surrogate's arguments but the advantages' values; an error names the argument.
    Returns (B, L, compute dtype, device, clip_low, clip_high, ready, empty): ready when the tensors
    are the kernels' operands as they are (3-D logp, everything contiguous and in the compute dtype,
    float weights with "sum", no constant that records autograd; the signature has each of these);
    empty when there is no term to compute."""
    logp = _validate.float_tensor("logp", logp)
    old_logp = _validate.float_tensor("old_logp", old_logp)
    advantages = _validate.float_tensor("advantages", advantages)
    _validate.ndim("logp", logp, allowed=(2, 3), layout="[B, L] or [T, B, L]")
    _validate.same_shape("old_logp", old_logp, logp.shape, "the shape of logp")
    B, L = logp.shape[-2:]
    if logp.ndim == 3 and logp.shape[0] == 0:
        raise ValueError(f"logp: got shape {tuple(logp.shape)}, expected at least one trajectory in dim 0 of [T, B, L]")
    _validate.same_shape("advantages", advantages, (B,), "[B], one per sample of logp")
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask: got {type(mask).__name__}, expected a bool or floating torch.Tensor")
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise TypeError(f"mask: got dtype {mask.dtype}, expected bool or a floating-point dtype")
    _validate.same_shape("mask", mask, (B, L), "[B, L] like the last two dims of logp")
    if mte_mask is not None and (not isinstance(mte_mask, torch.Tensor) or mte_mask.dtype != torch.bool):
        got = mte_mask.dtype if isinstance(mte_mask, torch.Tensor) else type(mte_mask).__name__
        raise TypeError(f"mte_mask: got {got}, expected a bool torch.Tensor or None")
    if mte_mask is not None:
        _validate.same_shape("mte_mask", mte_mask, (B, L), "[B, L] like the last two dims of logp")
    # no mte_mask: its zeros are made on logp's device
    device = _validate.same_device(
        logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, mte_mask=logp if mte_mask is None else mte_mask
    )
    _validate.choice("aggregation", aggregation, _AGGREGATIONS)
    clip_low = _validate.number("clip_eps", clip_eps, low=0.0)
    clip_high = clip_low if clip_eps_high is None else _validate.number("clip_eps_high", clip_eps_high, low=0.0)
    dtype = oracle.acc_dtype(torch.promote_types(logp.dtype, old_logp.dtype))
    constants = (old_logp, advantages, mask) + (() if mte_mask is None else (mte_mask,))
    ready = (
        logp.ndim == 3
        and aggregation == "sum"
        and all(t.dtype == dtype for t in (logp, old_logp, advantages, mask))
        and all(t.is_contiguous() for t in (logp, *constants))
        and not any(t.requires_grad for t in constants)
    )
    return B, L, dtype, device, clip_low, clip_high, ready, logp.numel() == 0
