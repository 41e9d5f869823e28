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
    "consistency_mask", _MODULE, _KERNELS, "(Tensor prev, Tensor cur, Tensor final, float threshold, str backend) -> Tensor",
    lambda kernels, backend, prev, cur, final, threshold: kernels[0](prev, cur, final, threshold),
    lambda prev, cur, final, threshold: prev.new_empty(prev.shape[0], dtype=torch.bool),
)


def consistency_mask(prev: torch.Tensor, cur: torch.Tensor, final: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """bool [...]: cos(cur, final) - cos(prev, final) > threshold, cosines over the last dim.

    Args:
        prev, cur, final: [..., C] floating tensors of one shape ([B, N, C] in the trainer), C >= 1;
            they compute in their common dtype, with float32 (float64) accumulation.
        threshold: python float; the comparison is strict, so 0.0 keeps only real improvements.
    """
    prev = _validate.float_tensor("prev", prev)
    cur = _validate.float_tensor("cur", cur)
    final = _validate.float_tensor("final", final)
    _validate.ndim("prev", prev, at_least=1, layout="[..., C], e.g. [B, N, C]")
    _validate.same_shape("cur", cur, prev.shape, "the shape of prev")
    _validate.same_shape("final", final, prev.shape, "the shape of prev")
    threshold = _validate.number("threshold", threshold)
    device = _validate.same_device(prev=prev, cur=cur, final=final)
    shape = prev.shape
    C = shape[-1]
    if C == 0:
        raise ValueError(f"prev: got shape {tuple(shape)}, expected at least one channel in the last dim")
    dtype = prev.dtype
    if not (cur.dtype == dtype and final.dtype == dtype):
        dtype = torch.promote_types(torch.promote_types(dtype, cur.dtype), final.dtype)
    M = prev.numel() // C
    flat = [_kernels.operand(t.reshape(M, C), dtype) for t in (prev, cur, final)]
    out = _OP(device, *flat, threshold, empty=M == 0)  # no positions: no kernel launch
    return out.reshape(shape[:-1])
