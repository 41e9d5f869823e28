"""trajectory_std(samples): how much K seed trajectories of a token disagree.

The uncertainty score of MAR-GRPO's top-k selection: the population std over the K seeds of each
final clean latent element, then the mean over its C channels. Gradients flow to samples (0 where
all K seeds agree, where the std has no derivative).
"""
from __future__ import annotations

import torch

from . import _kernels, _validate, reference

_MODULE = "trajectory_std"


@torch.library.custom_op("margrpo::trajectory_std", mutates_args=())
def _trajectory_std_op(samples: torch.Tensor, backend: str) -> torch.Tensor:
    return _kernels.get(backend, _MODULE, "trajectory_std_fwd")(samples)


@_trajectory_std_op.register_fake
def _(samples, backend):
    return samples.new_empty(samples.shape[1], dtype=reference.acc_dtype(samples.dtype))


@torch.library.custom_op("margrpo::trajectory_std_backward", mutates_args=())
def _trajectory_std_backward_op(grad_out: torch.Tensor, samples: torch.Tensor, backend: str) -> torch.Tensor:
    return _kernels.get(backend, _MODULE, "trajectory_std_bwd")(grad_out.contiguous(), samples)


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


def trajectory_std(samples: torch.Tensor) -> torch.Tensor:
    """Std over K trajectories (population, unbiased=False), then mean over channels.

    Args:
        samples: [K, ..., C] floating tensor, K >= 2 seeds, C >= 1 channels.
    Returns:
        [...] float32 (float64 for float64 input), differentiable with respect to samples.
    """
    samples = _validate.float_tensor("samples", samples)
    _validate.ndim("samples", samples, at_least=2, layout="[K, ..., C] with K seeds and C channels")
    K, C = samples.shape[0], samples.shape[-1]
    if K < 2:
        raise ValueError(f"samples: got K={K} trajectories (shape {tuple(samples.shape)}), expected K >= 2 in dim 0")
    if C == 0:
        raise ValueError(f"samples: got shape {tuple(samples.shape)}, expected at least one channel in the last dim")
    positions = samples.shape[1:-1]
    M = samples[0].numel() // C
    flat = samples.reshape(K, M, C).contiguous()
    # no positions: the reference returns the empty result without any kernel launch
    backend = "torch" if M == 0 else _kernels.pick(samples.device, "trajectory_std", _MODULE, "trajectory_std_fwd", "trajectory_std_bwd")
    return _trajectory_std_op(flat, backend).reshape(positions)
