"""gaussian_logprob(x, mean, std, reduce): log N(x; mean, std^2) per element, reduced over channels.

The per-step transition log-probability of a diffusion sampler, summed over a token's channels.
fp32 accumulation and output for fp16/bf16/fp32 inputs. Gradients flow to x, mean and std.
"""
from __future__ import annotations

import torch

from . import _kernels, _validate, reference

_MODULE = "gaussian_logprob"
_REDUCE = {"none": reference.REDUCE_NONE, "sum": reference.REDUCE_SUM, "mean": reference.REDUCE_MEAN}


def _check_std_positive(std: torch.Tensor) -> None:
    bad = int((std <= 0).sum())
    if bad:
        raise ValueError(
            f"std: {bad} of {std.numel()} values (after broadcasting over rows) are <= 0, expected std > 0; "
            "the 'torch' backend checks this, the others return NaN there"
        )


@torch.library.custom_op("margrpo::gaussian_logprob", mutates_args=())
def _gaussian_logprob_op(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int, backend: str) -> torch.Tensor:
    if backend == "torch":
        _check_std_positive(std)
    return _kernels.get(backend, _MODULE, "gaussian_logprob_fwd")(x, mean, std, reduce)


@_gaussian_logprob_op.register_fake
def _(x, mean, std, reduce, backend):
    out_shape = x.shape if reduce == reference.REDUCE_NONE else x.shape[:-1]
    return x.new_empty(out_shape, dtype=reference.acc_dtype(x.dtype))


@torch.library.custom_op("margrpo::gaussian_logprob_backward", mutates_args=())
def _gaussian_logprob_backward_op(
    grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kernel = _kernels.get(backend, _MODULE, "gaussian_logprob_bwd")
    gx, gm, gs = kernel(grad_out.contiguous(), x, mean, std, reduce)
    return gx, gm, gs


@_gaussian_logprob_backward_op.register_fake
def _(grad_out, x, mean, std, reduce, backend):
    dt = reference.acc_dtype(x.dtype)
    return x.new_empty(x.shape, dtype=dt), x.new_empty(x.shape, dtype=dt), std.new_empty(std.shape, dtype=dt)


def _setup_context(ctx, inputs, output):
    x, mean, std, reduce, backend = inputs
    ctx.save_for_backward(x, mean, std)
    ctx.reduce, ctx.backend = reduce, backend


def _backward(ctx, grad_out):
    x, mean, std = ctx.saved_tensors
    gx, gm, gs = _gaussian_logprob_backward_op(grad_out, x, mean, std, ctx.reduce, ctx.backend)
    return gx.to(x.dtype), gm.to(mean.dtype), gs.to(std.dtype), None, None


_gaussian_logprob_op.register_autograd(_backward, setup_context=_setup_context)


def _std_tensor(std: object, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """std as a tensor broadcastable to x (a python number becomes a 0-d tensor of `dtype`)."""
    if isinstance(std, (int, float)) and not isinstance(std, bool):
        return torch.tensor(float(std), dtype=dtype, device=x.device)
    std = _validate.float_tensor("std", std)
    try:
        fits = std.ndim <= x.ndim and torch.broadcast_shapes(std.shape, x.shape) == x.shape
    except RuntimeError:  # not broadcastable at all
        fits = False
    if not fits:
        raise ValueError(
            f"std: got shape {tuple(std.shape)}, expected a python float, a 0-d tensor, [..., 1] per row "
            f"or [..., C] per element, broadcastable to x's shape {tuple(x.shape)}"
        )
    return std


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: float | torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """log N(x; mean, std^2) per element, reduced over the last (channel) dim.

    Args:
        x, mean: [..., C] floating tensors of one shape (C >= 1).
        std: a python float, a 0-d tensor, [..., 1] (one std per row) or [..., C] (per element);
            any tensor that broadcasts to x's shape.
        reduce: "sum" -> [...], "mean" -> [...], "none" -> [..., C].

    The three inputs compute in their common dtype (torch.promote_types); the result is float32
    (float64 for float64 inputs). Gradients flow to x, mean and std (to std's own shape).

    std <= 0: the "torch" (reference) backend raises ValueError naming std and the bad count; the
    fused backends (cpp, cuda, triton) follow the kernel policy and return NaN for those elements,
    so a bad std is visible without a host synchronisation.
    """
    _validate.choice("reduce", reduce, tuple(_REDUCE))
    x = _validate.float_tensor("x", x)
    mean = _validate.float_tensor("mean", mean)
    _validate.ndim("x", x, at_least=1, layout="[..., C] with at least one dim")
    _validate.same_shape("mean", mean, x.shape, "the shape of x")
    dtype = torch.promote_types(x.dtype, mean.dtype)
    std = _std_tensor(std, x, dtype)
    device = _validate.same_device(x=x, mean=mean, std=std)
    C = x.shape[-1]
    if C == 0:
        raise ValueError(f"x: got shape {tuple(x.shape)}, expected at least one channel in the last dim")
    dtype = torch.promote_types(dtype, std.dtype)
    rows = x.shape[:-1]
    R = x.numel() // C
    per_row = std.ndim == 0 or std.shape[-1] == 1
    std2 = std.expand(*rows, 1 if per_row else C).reshape(R, 1 if per_row else C)
    x2 = x.reshape(R, C).to(dtype).contiguous()
    mean2 = mean.reshape(R, C).to(dtype).contiguous()
    std2 = std2.to(dtype).contiguous()
    # no rows: the reference returns the empty result without any kernel launch
    backend = "torch" if R == 0 else _kernels.pick(device, "gaussian_logprob", _MODULE, "gaussian_logprob_fwd", "gaussian_logprob_bwd")
    out = _gaussian_logprob_op(x2, mean2, std2, _REDUCE[reduce], backend)
    return out.reshape(x.shape if reduce == "none" else rows)
