"""gaussian_logprob(x, mean, std, reduce): log N(x; mean, std^2) per element, reduced over channels.

The per-step transition log-probability of a diffusion sampler, summed over a token's channels.
fp32 accumulation and output for fp16/bf16/fp32 inputs. Gradients flow to x, mean and std.
"""
from __future__ import annotations

import torch

from . import _backend, reference

_REDUCE = {"none": reference.REDUCE_NONE, "sum": reference.REDUCE_SUM, "mean": reference.REDUCE_MEAN}


def _kernel_fwd(backend: str):
    if backend == "torch":
        return reference.gaussian_logprob_fwd
    if backend == "triton":
        from margrpo.kernels import gaussian_logprob as k

        return k.gaussian_logprob_fwd
    return torch.ops.margrpo.gaussian_logprob_fwd


def _kernel_bwd(backend: str):
    if backend == "torch":
        return reference.gaussian_logprob_bwd
    if backend == "triton":
        from margrpo.kernels import gaussian_logprob as k

        return k.gaussian_logprob_bwd
    return torch.ops.margrpo.gaussian_logprob_bwd


@torch.library.custom_op("margrpo::gaussian_logprob", mutates_args=())
def _gaussian_logprob_op(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int, backend: str) -> torch.Tensor:
    return _kernel_fwd(backend)(x, mean, std, reduce)


@_gaussian_logprob_op.register_fake
def _(x, mean, std, reduce, backend):
    out_shape = x.shape if reduce == reference.REDUCE_NONE else x.shape[:-1]
    return x.new_empty(out_shape, dtype=reference.acc_dtype(x.dtype))


@torch.library.custom_op("margrpo::gaussian_logprob_backward", mutates_args=())
def _gaussian_logprob_backward_op(
    grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduce: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gx, gm, gs = _kernel_bwd(backend)(grad_out.contiguous(), x, mean, std, reduce)
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
