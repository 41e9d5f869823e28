"""gaussian_logprob(x, mean, std, reduce): log N(x; mean, std^2) per element, reduced over channels.

The per-step transition log-probability of a diffusion sampler, summed over a token's channels.
fp32 accumulation and output for fp16/bf16/fp32 inputs. Gradients flow to x, mean and std.

One std policy for every backend: std <= 0 (no density, e.g. a deterministic step's std = 0) is a
ValueError naming std, unless the caller chose the sync-free path with check_std=False, where the
kernels give NaN for those elements (the check reads the data: a host sync on a GPU).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import _kernels, _validate, oracle
from ._factory import FusedOp, Gradient

_MODULE = "gaussian_logprob"
_KERNELS = ("gaussian_logprob_fwd", "gaussian_logprob_bwd")
_REDUCE = {"none": oracle.REDUCE_NONE, "sum": oracle.REDUCE_SUM, "mean": oracle.REDUCE_MEAN}
_REDUCE_NAMES = tuple(_REDUCE)


def _check_std_positive(std: torch.Tensor) -> None:
    bad = int((std <= 0).sum())
    if bad:
        raise ValueError(
            f"std: {bad} of {std.numel()} values (after broadcasting over rows) are <= 0, expected std > 0 "
            "(a step without noise has no density: leave it out, see Sampler.stochastic_steps); "
            "check_std=False skips this check and gives NaN there"
        )


def _forward(kernels, backend: str, x, mean, std, reduce: int, check_std: bool):
    if check_std:
        _check_std_positive(std)
    return kernels[0](x, mean, std, reduce)


def _fake(x, mean, std, reduce, check_std):
    out_shape = x.shape if reduce == oracle.REDUCE_NONE else x.shape[:-1]
    return x.new_empty(out_shape, dtype=oracle.acc_dtype(x.dtype))


def _backward_fake(grad_out, x, mean, std, reduce):
    dt = oracle.acc_dtype(x.dtype)
    return x.new_empty(x.shape, dtype=dt), x.new_empty(x.shape, dtype=dt), std.new_empty(std.shape, dtype=dt)


def _save(inputs, output):
    x, mean, std, reduce, _check_std = inputs
    return (x, mean, std), (reduce,)


def _backward(run, saved, attrs, grad_out):
    x, mean, std = saved
    gx, gm, gs = run(grad_out, x, mean, std, *attrs)
    return gx.to(x.dtype), gm.to(mean.dtype), gs.to(std.dtype), None, None


_OP = FusedOp(
    "gaussian_logprob",
    _MODULE,
    _KERNELS,
    "(Tensor x, Tensor mean, Tensor std, int reduce, bool check_std, str backend) -> Tensor",
    _forward,
    _fake,
    Gradient(
        _save,
        _backward,
        kernel=_KERNELS[1],
        fake=_backward_fake,
        schema="(Tensor grad_out, Tensor x, Tensor mean, Tensor std, int reduce, str backend) -> (Tensor, Tensor, Tensor)",
    ),
)


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether `shape` broadcasts to `target` without growing it (torch.broadcast_shapes(shape,
    target) == target), on the tuples: the torch function costs about 35 us."""
    return len(shape) <= len(target) and all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _std_width(std: object, x: torch.Tensor) -> tuple[int, bool]:
    """(width, expand) of std's kernel layout [R, width]: width 1 (per row) or C (per element), and
    whether std must first be expanded over x's row dims (0-d, per channel, or broadcast over some of
    them). A python number is one std for every row."""
    if isinstance(std, (int, float)) and not isinstance(std, bool):
        return 1, False
    std = _validate.float_tensor("std", std)
    shape = std.shape
    if not _broadcasts_to(shape, x.shape):
        raise ValueError(
            f"std: got shape {tuple(shape)}, expected a python float, a 0-d tensor, [..., 1] per row "
            f"or [..., C] per element, broadcastable to x's shape {tuple(x.shape)}"
        )
    width = 1 if std.ndim == 0 or shape[-1] == 1 else x.shape[-1]
    return width, shape[:-1] != x.shape[:-1]


class _Plan(NamedTuple):
    """What a call signature's checks derive: the kernel layout [R, C], std's width, the compute dtype."""

    R: int
    C: int
    width: int
    expand_std: bool
    dtype: torch.dtype
    device: torch.device
    code: int
    out_shape: tuple[int, ...]  # ints, not a torch.Size: reshape parses a Size about 1 us slower


def _plan(x: object, mean: object, std: object, reduce: object) -> _Plan:
    """Every metadata check of gaussian_logprob's arguments; an error names the argument."""
    _validate.choice("reduce", reduce, _REDUCE_NAMES)
    x = _validate.float_tensor("x", x)
    mean = _validate.float_tensor("mean", mean)
    _validate.ndim("x", x, at_least=1, layout="[..., C] with at least one dim")
    _validate.same_shape("mean", mean, x.shape, "the shape of x")
    C = x.shape[-1]
    if C == 0:
        raise ValueError(f"x: got shape {tuple(x.shape)}, expected at least one channel in the last dim")
    width, expand = _std_width(std, x)
    dtype = x.dtype if mean.dtype == x.dtype else torch.promote_types(x.dtype, mean.dtype)
    if isinstance(std, torch.Tensor):
        device = _validate.same_device(x=x, mean=mean, std=std)
        dtype = torch.promote_types(dtype, std.dtype)
    else:
        device = _validate.same_device(x=x, mean=mean)
    code = _REDUCE[reduce]
    return _Plan(x.numel() // C, C, width, expand, dtype, device, code, tuple(x.shape if code == oracle.REDUCE_NONE else x.shape[:-1]))


_PLANS: dict[tuple, _Plan] = {}  # call signature -> its _Plan (see _validate.remember)


def gaussian_logprob(
    x: torch.Tensor, mean: torch.Tensor, std: float | torch.Tensor, reduce: str = "sum", *, check_std: bool = True
) -> torch.Tensor:
    """log N(x; mean, std^2) per element, reduced over the last (channel) dim.

    Args:
        x, mean: [..., C] floating tensors of one shape (C >= 1).
        std: a python float, a 0-d tensor, [..., 1] (one std per row) or [..., C] (per element);
            any tensor that broadcasts to x's shape.
        reduce: "sum" -> [...], "mean" -> [...], "none" -> [..., C].
        check_std: raise ValueError when std has values <= 0 (every backend; costs a host sync on a
            GPU). False: the sync-free path, where those elements (and their row's sum or mean) are NaN.

    The three inputs compute in their common dtype (torch.promote_types); the result is float32
    (float64 for float64 inputs). Gradients flow to x, mean and std (to std's own shape).

    std <= 0: with check_std (the default) every backend raises ValueError naming std and the bad
    count; with check_std=False every backend returns NaN for those elements (the kernel policy), so
    a bad std stays visible without a host synchronisation.
    """
    key = plan = None
    if not torch.compiler.is_compiling():
        try:
            tensors = _validate.signature(x, mean, std) if isinstance(std, torch.Tensor) else (_validate.signature(x, mean), type(std))
            key = (tensors, reduce)
            plan = _PLANS.get(key)
        except (AttributeError, TypeError):  # an argument that is no tensor (the checks name it)
            key = None
    if plan is None:
        plan = _plan(x, mean, std, reduce)
        _validate.remember(_PLANS, key, plan)
    R, C, dtype = plan.R, plan.C, plan.dtype
    if isinstance(std, torch.Tensor):
        std2 = (std.expand(*x.shape[:-1], plan.width) if plan.expand_std else std).reshape(R, plan.width)
    else:
        std2 = torch.full((R, 1), float(std), dtype=dtype, device=plan.device)
    operand = _kernels.operand
    x2, mean2, std2 = operand(x.reshape(R, C), dtype), operand(mean.reshape(R, C), dtype), operand(std2, dtype)
    out = _OP.run(plan.device, (x2, mean2, std2, plan.code, bool(check_std)), R == 0)
    return out.reshape(*plan.out_shape) if plan.out_shape else out.reshape(())
