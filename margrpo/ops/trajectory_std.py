"""trajectory_std(samples): how much K seed trajectories of a token disagree.

The uncertainty score of MAR-GRPO's top-k selection: the population std over the K seeds of each
final clean latent element, then the mean over its C channels. Gradients flow to samples (0 where
all K seeds agree, where the std has no derivative).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from . import _kernels, _validate, reference

_MODULE = "trajectory_std"
_KERNELS = ("trajectory_std_fwd", "trajectory_std_bwd")


@torch.library.custom_op("margrpo::trajectory_std", mutates_args=())
def _trajectory_std_op(samples: torch.Tensor, backend: str) -> torch.Tensor:
    return _kernels.get(backend, _MODULE, _KERNELS[0])(samples)


@_trajectory_std_op.register_fake
def _(samples, backend):
    return samples.new_empty(samples.shape[1], dtype=reference.acc_dtype(samples.dtype))


@torch.library.custom_op("margrpo::trajectory_std_backward", mutates_args=())
def _trajectory_std_backward_op(grad_out: torch.Tensor, samples: torch.Tensor, backend: str) -> torch.Tensor:
    return _kernels.get(backend, _MODULE, _KERNELS[1])(grad_out.contiguous(), samples)


@_trajectory_std_backward_op.register_fake
def _(grad_out, samples, backend):
    return samples.new_empty(samples.shape, dtype=reference.acc_dtype(samples.dtype))


def _setup_context(ctx, inputs, output):
    samples, backend = inputs
    ctx.save_for_backward(samples)
    ctx.backend = backend


def _backward(ctx, grad_out):
    (samples,) = ctx.saved_tensors
    return _trajectory_std_backward_op(grad_out, samples, ctx.backend).to(samples.dtype), None


_trajectory_std_op.register_autograd(_backward, setup_context=_setup_context)


class _TrajectoryStdFunction(torch.autograd.Function):
    """The eager path's autograd: the kernels called directly, without the custom op's dispatch."""

    @staticmethod
    def forward(ctx, samples, backend: str, fwd: Callable, bwd: Callable):
        ctx.save_for_backward(samples)
        ctx.backend, ctx.bwd = backend, bwd
        return fwd(samples)

    @staticmethod
    def backward(ctx, grad_out):
        (samples,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: the backward custom op records that it has no derivative of its own
            grad = _trajectory_std_backward_op(grad_out, samples, ctx.backend)
        else:
            grad = ctx.bwd(grad_out.contiguous(), samples)
        return grad.to(samples.dtype), None, None, None


def trajectory_std(samples: torch.Tensor) -> torch.Tensor:
    """Std over K trajectories (population, unbiased=False), then mean over channels.

    Args:
        samples: [K, ..., C] floating tensor, K >= 2 seeds, C >= 1 channels.
    Returns:
        [...] float32 (float64 for float64 input), differentiable with respect to samples.
    """
    samples = _validate.float_tensor("samples", samples)
    _validate.ndim("samples", samples, at_least=2, layout="[K, ..., C] with K seeds and C channels")
    shape = samples.shape
    K, C = shape[0], shape[-1]
    if K < 2:
        raise ValueError(f"samples: got K={K} trajectories (shape {tuple(shape)}), expected K >= 2 in dim 0")
    if C == 0:
        raise ValueError(f"samples: got shape {tuple(shape)}, expected at least one channel in the last dim")
    M = samples.numel() // (K * C)
    flat = samples.reshape(K, M, C).contiguous()
    if _kernels.direct_call_allowed():
        backend, (fwd, bwd) = _kernels.for_eager(samples.device, "trajectory_std", _MODULE, _KERNELS, empty=M == 0)
        out = _TrajectoryStdFunction.apply(flat, backend, fwd, bwd) if _kernels.needs_grad(flat) else fwd(flat)
    else:
        # no positions: the reference returns the empty result without any kernel launch
        backend = "torch" if M == 0 else _kernels.pick(samples.device, "trajectory_std", _MODULE, *_KERNELS)
        out = _trajectory_std_op(flat, backend)
    return out.reshape(shape[1:-1])
