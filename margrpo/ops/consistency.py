"""consistency_mask: keep a position when its predicted clean latent moved toward the final one.

MAR-GRPO's consistency-aware selection: at a mask step, position n stays in the policy term when
cos(cur_n, final_n) - cos(prev_n, final_n) > threshold (strict), where cur/prev are the step's and
the previous step's predicted clean latents. A zero-norm vector has cosine 0 with anything.
"""
from __future__ import annotations

import torch

from . import _kernels, _validate

_MODULE = "consistency"
_KERNELS = ("consistency_mask_fwd",)


@torch.library.custom_op("margrpo::consistency_mask", mutates_args=())
def _consistency_mask_op(prev: torch.Tensor, cur: torch.Tensor, final: torch.Tensor, threshold: float, backend: str) -> torch.Tensor:
    return _kernels.get(backend, _MODULE, _KERNELS[0])(prev, cur, final, threshold)


@_consistency_mask_op.register_fake
def _(prev, cur, final, threshold, backend):
    return prev.new_empty(prev.shape[0], dtype=torch.bool)


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
    if _kernels.direct_call_allowed():
        _, (kernel,) = _kernels.for_eager(device, "consistency_mask", _MODULE, _KERNELS, empty=M == 0)
        out = kernel(*flat, threshold)
    else:
        # no positions: the reference returns the empty result without any kernel launch
        backend = "torch" if M == 0 else _kernels.pick(device, "consistency_mask", _MODULE, *_KERNELS)
        out = _consistency_mask_op(*flat, threshold, backend)
    return out.reshape(shape[:-1])
