"""topk_mask / topk_indices: the k highest-scoring positions of every row, exactly k per row.

MAR-GRPO applies multi-trajectory expectation only on the k = floor(ratio * N) most uncertain
positions of each image. Ties are broken toward the lower index, so the choice is deterministic
and every backend picks the same positions. No gradient (the outputs are indices and masks).
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._factory import FusedOp

_MODULE = "topk"
# ratio * N is computed in binary floating point: 0.29 * 100 gives 28.999999999999996. A relative
# nudge far below any real fractional part makes floor() return the intended 29.
_FLOOR_NUDGE = 1e-12


def _check_no_nan(scores: torch.Tensor) -> None:
    nan = int(torch.isnan(scores).sum())
    if nan:
        raise ValueError(
            f"scores: got {nan} NaN values, expected none (NaN has no rank); pass check_finite=False to skip this check on hot paths"
        )


def _forward(kernels, backend: str, scores, k: int, check_finite: bool):
    if check_finite:
        _check_no_nan(scores)
    return kernels[0](scores, k)


_SCHEMA = "(Tensor scores, int k, bool check_finite, str backend) -> Tensor"
_OPS = {
    "topk_mask": FusedOp(
        "topk_mask",
        _MODULE,
        ("topk_mask_fwd",),
        _SCHEMA,
        _forward,
        lambda scores, k, check_finite: scores.new_empty(scores.shape, dtype=torch.bool),
    ),
    "topk_indices": FusedOp(
        "topk_indices",
        _MODULE,
        ("topk_indices_fwd",),
        _SCHEMA,
        _forward,
        lambda scores, k, check_finite: scores.new_empty((scores.shape[0], k), dtype=torch.int64),
    ),
}


_MASK, _INDICES = _OPS["topk_mask"], _OPS["topk_indices"]
# call signature (scores' metadata, ratio, k) -> (k, scores contiguous, no work); _validate.remember
_PLANS: dict[tuple, tuple[int, bool, bool]] = {}


def _scores_and_k(scores: object, ratio: float | None, k: int | None) -> tuple[torch.Tensor, int, bool]:
    """scores (contiguous), the k of each row and whether there is no work (an empty batch or row: the
    oracle then returns the empty result without any kernel launch), after the checks; a signature
    that passed them skips them."""
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = (_validate.signature(scores), type(ratio), ratio, type(k), k)
            known = _PLANS.get(key)
        except (AttributeError, TypeError):  # not a tensor (the checks name it)
            key = known = None
        if known is not None:
            k, contiguous, empty = known
            return (scores if contiguous else scores.contiguous()), k, empty
    scores, k = _checked_scores_and_k(scores, ratio, k)
    plan = (k, scores.is_contiguous(), scores.numel() == 0)
    _validate.remember(_PLANS, key, plan)
    return scores.contiguous(), k, plan[2]


def _checked_scores_and_k(scores: object, ratio: float | None, k: int | None) -> tuple[torch.Tensor, int]:
    scores = _validate.float_tensor("scores", scores)
    _validate.ndim("scores", scores, allowed=(2,), layout="[B, N]")
    N = scores.shape[1]
    if (ratio is None) == (k is None):
        raise ValueError(f"ratio, k: got ratio={ratio!r} and k={k!r}, expected exactly one of them")
    if ratio is not None:
        ratio = _validate.number("ratio", ratio, 0.0, 1.0)
        return scores, min(N, math.floor(ratio * N * (1.0 + _FLOOR_NUDGE)))
    return scores, _validate.integer("k", k, 0, N)


def topk_mask(scores: torch.Tensor, ratio: float | None = None, k: int | None = None, *, check_finite: bool = True) -> torch.Tensor:
    """bool [B, N], True at exactly k positions per row: the k largest scores, ties to the lower index.

    Args:
        scores: [B, N] floating tensor (no NaN).
        ratio: fraction in [0, 1]; k = floor(ratio * N). Give ratio or k, not both.
        k: number of positions per row, 0 <= k <= N.
        check_finite: raise ValueError when scores holds NaN (costs a host sync; turn it off on
            GPU hot paths where the scores are known to be clean). +-inf scores rank normally.
    """
    scores, k, empty = _scores_and_k(scores, ratio, k)
    return _MASK.run(scores.device, (scores, k, check_finite), empty)


def topk_indices(scores: torch.Tensor, ratio: float | None = None, k: int | None = None, *, check_finite: bool = True) -> torch.Tensor:
    """int64 [B, k]: the positions of the k largest scores per row, by descending score; equal scores
    are chosen and ordered toward the lower index. Arguments as in topk_mask."""
    scores, k, empty = _scores_and_k(scores, ratio, k)
    return _INDICES.run(scores.device, (scores, k, check_finite), empty)
