"""Small helpers shared by the Triton launchers: dtype policy, input checks, block-size rules.

Block sizes are chosen by simple rules instead of @triton.autotune, so the same launchers run under
TRITON_INTERPRET=1 (where autotune has no driver) and on the GPU without a tuning pass per shape.

Row counts (tokens, rows of a selection) are listed in each kernel's `do_not_specialize`: by default
Triton compiles a new variant of a kernel when an integer argument changes between 1, a multiple of
16 and anything else, and a rollout's token count changes at every mask step, so a timed step would
pay for compiles its warm-up never saw. Only counts that bound masks or index rows are listed;
widths and strides stay specialised, because their divisibility lets the loads vectorise.
"""

from __future__ import annotations

import torch
import triton

from margrpo.ops.oracle import acc_dtype

__all__ = ["acc_dtype", "programs_block", "require_contiguous", "warps_for"]


def require_contiguous(name: str, tensor: torch.Tensor, ndim: int) -> None:
    """Reject layouts the kernels would silently misread (the contract promises contiguous inputs)."""
    if tensor.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tensor.stride()}")


def warps_for(tile_elements: int) -> int:
    """num_warps for a tile: about 8 elements per thread (more only past 16 warps), 1 to 16 warps.
    Measured on sm_90 AOT builds: 16 fp32 elements per thread took the gaussian backward to 254
    registers; 8 keeps these kernels well under 128."""
    return max(1, min(16, triton.next_power_of_2(tile_elements) // 256))


def programs_block(n: int, max_block: int, min_block: int = 128, target_programs: int = 264) -> int:
    """Power-of-two block over n independent elements: small enough to give about target_programs
    programs (two per SM of an H200) so the whole GPU streams, but at least min_block for
    coalescing and at most max_block for registers."""
    want = triton.next_power_of_2(max(1, triton.cdiv(n, target_programs)))
    return max(min_block, min(max_block, want))
