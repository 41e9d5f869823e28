"""consistency_mask: keep a position when its predicted clean latent moved toward the final one.

MAR-GRPO's consistency-aware selection: at a mask step, position n stays in the policy term when
cos(cur_n, final_n) - cos(prev_n, final_n) > threshold (strict), where cur/prev are the step's and
the previous step's predicted clean latents. A zero-norm vector has cosine 0 with anything.
"""

from __future__ import annotations

import torch

from . import _kernels, _validate
from ._factory import FusedOp

_MODULE = "consistency"
_KERNELS = ("consistency_mask_fwd",)


_OP = FusedOp(
    "consistency_mask",
    _MODULE,
    _KERNELS,
    "(Tensor prev, Tensor cur, Tensor final, float threshold, str backend) -> Tensor",
    None,  # forward: the kernel itself
    lambda prev, cur, final, threshold: prev.new_empty(prev.shape[0], dtype=torch.bool),
)


def consistency_mask(prev: torch.Tensor, cur: torch.Tensor, final: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """bool [...]: cos(cur, final) - cos(prev, final) > threshold, cosines over the last dim.

    Args:
        prev, cur, final: [..., C] floating tensors of one shape ([B, N, C] in the trainer), C >= 1;
            they compute in their common dtype, with float32 (float64) accumulation.
        threshold: python float; the comparison is strict, so 0.0 keeps only real improvements.
    """
    threshold = _validate.number("threshold", threshold)  # a value: checked on every call
    key = plan = None
    if not torch.compiler.is_compiling():
        try:
            key = _validate.signature(prev, cur, final)
            plan = _PLANS.get(key)
        except (AttributeError, TypeError):  # an argument that is no tensor (the checks name it)
            key = None
    if plan is None:
        plan = _plan(prev, cur, final)
        _validate.remember(_PLANS, key, plan)
    M, C, dtype, device, out_shape = plan
    operand = _kernels.operand
    flat = [operand(t.reshape(M, C), dtype) for t in (prev, cur, final)]
    out = _OP.run(device, (*flat, threshold), M == 0)  # no positions: no kernel launch
    return out.reshape(*out_shape) if out_shape else out.reshape(())


_PLANS: dict[tuple, tuple] = {}  # call signature -> (M, C, dtype, device, output shape); _validate.remember


def _plan(prev: object, cur: object, final: object) -> tuple:
    """Every metadata check of consistency_mask's tensors; an error names the argument."""
    prev = _validate.float_tensor("prev", prev)
    cur = _validate.float_tensor("cur", cur)
    final = _validate.float_tensor("final", final)
    _validate.ndim("prev", prev, at_least=1, layout="[..., C], e.g. [B, N, C]")
    _validate.same_shape("cur", cur, prev.shape, "the shape of prev")
    _validate.same_shape("final", final, prev.shape, "the shape of prev")
    device = _validate.same_device(prev=prev, cur=cur, final=final)
    shape = prev.shape
    C = shape[-1]
    if C == 0:
        raise ValueError(f"prev: got shape {tuple(shape)}, expected at least one channel in the last dim")
    dtype = prev.dtype
    if not (cur.dtype == dtype and final.dtype == dtype):
        dtype = torch.promote_types(torch.promote_types(dtype, cur.dtype), final.dtype)
    return prev.numel() // C, C, dtype, device, tuple(shape[:-1])  # ints: reshape parses a Size slower
