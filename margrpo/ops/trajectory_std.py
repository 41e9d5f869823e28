"""trajectory_std(samples): how much K seed trajectories of a token disagree.

The uncertainty score of MAR-GRPO's top-k selection: the population std over the K seeds of each
final clean latent element, then the mean over its C channels. Gradients flow to samples (0 where
all K seeds agree, where the std has no derivative).
"""

from __future__ import annotations

import torch

from . import _validate, oracle
from ._factory import FusedOp, Gradient

_MODULE = "trajectory_std"
_KERNELS = ("trajectory_std_fwd", "trajectory_std_bwd")


def _fake(samples):
    return samples.new_empty(samples.shape[1], dtype=oracle.acc_dtype(samples.dtype))


def _backward_fake(grad_out, samples):
    return samples.new_empty(samples.shape, dtype=oracle.acc_dtype(samples.dtype))


def _backward(run, saved, attrs, grad_out):
    (samples,) = saved
    return (run(grad_out, samples).to(samples.dtype),)


_OP = FusedOp(
    "trajectory_std",
    _MODULE,
    _KERNELS,
    "(Tensor samples, str backend) -> Tensor",
    None,  # forward: the kernel itself
    _fake,
    Gradient(
        lambda inputs, output: (inputs, ()),
        _backward,
        kernel=_KERNELS[1],
        fake=_backward_fake,
        schema="(Tensor grad_out, Tensor samples, str backend) -> Tensor",
    ),
)


def trajectory_std(samples: torch.Tensor) -> torch.Tensor:
    """Std over K trajectories (population, unbiased=False), then mean over channels.

    Args:
        samples: [K, ..., C] floating tensor, K >= 2 seeds, C >= 1 channels.
    Returns:
        [...] float32 (float64 for float64 input), differentiable with respect to samples.
    """
    key = plan = None
    if not torch.compiler.is_compiling():
        try:
            key = _validate.signature(samples)
            plan = _PLANS.get(key)
        except (AttributeError, TypeError):  # not a tensor (the checks name it)
            key = None
    if plan is None:
        plan = _plan(samples)
        _validate.remember(_PLANS, key, plan)
    K, M, C, out_shape = plan
    out = _OP.run(samples.device, (samples.reshape(K, M, C).contiguous(),), M == 0)
    return out.reshape(*out_shape) if out_shape else out.reshape(())


_PLANS: dict[tuple, tuple] = {}  # call signature -> (K, M, C, output shape); see _validate.remember


def _plan(samples: object) -> tuple:
    """Every metadata check of trajectory_std's argument; an error names it."""
    samples = _validate.float_tensor("samples", samples)
    _validate.ndim("samples", samples, at_least=2, layout="[K, ..., C] with K seeds and C channels")
    shape = samples.shape
    K, C = shape[0], shape[-1]
    if K < 2:
        raise ValueError(f"samples: got K={K} trajectories (shape {tuple(shape)}), expected K >= 2 in dim 0")
    if C == 0:
        raise ValueError(f"samples: got shape {tuple(shape)}, expected at least one channel in the last dim")
    return K, samples.numel() // (K * C), C, tuple(shape[1:-1])  # ints: reshape parses a Size slower
