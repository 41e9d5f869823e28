"""ops.topk_mask / ops.topk_indices on every backend: exact k per row, ties to the lower index."""

from __future__ import annotations

import pytest
import torch
from conftest import randn

import margrpo.ops as ops

pytestmark = pytest.mark.usefixtures("poison_uninitialized")
MODULE = "topk"
F64, F32, BF16, F16 = torch.float64, torch.float32, torch.bfloat16, torch.float16


def expected_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Plain Python: order positions by (descending score, ascending index), keep the first k."""
    rows = scores.double().cpu().tolist()
    order = [sorted(range(len(row)), key=lambda i: (-row[i], i))[:k] for row in rows]
    return torch.tensor(order, dtype=torch.int64).reshape(len(rows), k)


def expected_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    return mask.scatter_(1, expected_indices(scores, k), True)


def check(scores: torch.Tensor, expected_k: int, **how) -> None:
    """Both variants against the plain-Python expectation; `how` is ratio=... or k=..."""
    k = expected_k
    mask = ops.topk_mask(scores, **how)
    indices = ops.topk_indices(scores, **how)
    assert mask.dtype == torch.bool and mask.shape == scores.shape
    assert indices.dtype == torch.int64 and indices.shape == (scores.shape[0], k)
    assert torch.equal(mask.sum(1).cpu(), torch.full((scores.shape[0],), k))
    assert torch.equal(mask.cpu(), expected_mask(scores, k))
    assert torch.equal(indices.cpu(), expected_indices(scores, k))


def tied_scores(gen, B, N, dtype, device, levels=4):
    """Few distinct values, so most rows have many ties across the top-k boundary."""
    return torch.randint(0, levels, (B, N), generator=gen).to(device=device, dtype=dtype)


# (B, N, k, dtype, tied)
CASES = [
    (1, 1, 1, F32, False),
    (3, 7, 3, F64, False),
    (4, 33, 10, BF16, True),
    (2, 17, 5, F16, True),
    (5, 16, 16, F32, True),
    (3, 33, 0, F32, False),
    (2, 100, 29, F32, True),
    (3, 257, 77, F32, False),
]


@pytest.mark.parametrize("B, N, k, dtype, tied", CASES)
def test_matches_reference(backend, gen, B, N, k, dtype, tied):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    make = tied_scores if tied else (lambda g, b, n, dt, dev: randn(g, b, n, dtype=dt, device=dev))
    check(make(gen, B, N, dtype, backend.device), k, k=k)


def test_ties_go_to_the_lower_index(backend):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    scores = torch.tensor(
        [[0.0] * 9, [2.0, 1.0, 2.0, 3.0, 1.0, 3.0, 2.0, 0.0, 3.0], [5.0, 5.0, 5.0, 1.0, 5.0, 5.0, 9.0, 5.0, 5.0]],
        device=backend.device,
    )
    indices = ops.topk_indices(scores, k=4).cpu()
    assert indices.tolist() == [[0, 1, 2, 3], [3, 5, 8, 0], [6, 0, 1, 2]]
    check(scores, 4, k=4)


def test_infinite_scores_rank_normally(backend):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    inf = float("inf")
    scores = torch.tensor([[1.0, -inf, inf, 0.0, inf, -inf]], device=backend.device)
    assert ops.topk_indices(scores, k=6).cpu().tolist() == [[2, 4, 0, 3, 1, 5]]
    check(scores, 3, k=3)


@pytest.mark.parametrize(
    "N, ratio, k",
    [(10, 0.3, 3), (100, 0.29, 29), (7, 0.5, 3), (1024, 0.3, 307), (9, 1.0, 9), (9, 0.0, 0), (9, 0.99, 8)],
)
def test_ratio_is_floored(backend, gen, N, ratio, k):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    check(randn(gen, 2, N, dtype=F32, device=backend.device), k, ratio=ratio)


def test_non_contiguous_scores(backend, gen):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    scores = tied_scores(gen, 13, 4, F32, backend.device).t()  # [4, 13], transposed view
    assert not scores.is_contiguous()
    check(scores, 6, k=6)


@pytest.mark.parametrize("B, N, ratio", [(0, 5, 0.5), (3, 0, 0.5), (0, 0, 1.0)])
def test_empty_scores(backend, B, N, ratio):
    scores = torch.zeros(B, N, device=backend.device)
    k = int(ratio * N)
    assert ops.topk_mask(scores, ratio=ratio).shape == (B, N)
    assert ops.topk_indices(scores, ratio=ratio).shape == (B, k)


def test_nan_scores(backend, gen):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    scores = randn(gen, 2, 6, dtype=F32, device=backend.device)
    scores[1, 2] = float("nan")
    for op in (ops.topk_mask, ops.topk_indices):
        with pytest.raises(ValueError, match="scores: got 1 NaN values"):
            op(scores, k=2)
    # the check can be turned off (no host sync); the shapes stay right, the choice is unspecified
    assert ops.topk_mask(scores, k=2, check_finite=False).shape == (2, 6)
    assert ops.topk_indices(scores, k=2, check_finite=False).shape == (2, 2)


def test_opcheck(backend, gen):
    backend.require(MODULE, "topk_mask_fwd", "topk_indices_fwd")
    scores = tied_scores(gen, 3, 9, F32, backend.device)
    for op in (torch.ops.margrpo.topk_mask.default, torch.ops.margrpo.topk_indices.default):
        torch.library.opcheck(op, (scores, 4, True, backend.name))


@pytest.mark.parametrize(
    "scores, how, error, match",
    [
        (torch.ones(2, 5), dict(ratio=0.5, k=2), ValueError, "ratio, k: got ratio=0.5 and k=2, expected exactly one"),
        (torch.ones(2, 5), dict(), ValueError, "ratio, k: got ratio=None and k=None"),
        (torch.ones(2, 5), dict(ratio=1.5), ValueError, r"ratio: got 1.5, expected a number in \[0.0, 1.0\]"),
        (torch.ones(2, 5), dict(ratio=-0.1), ValueError, "ratio: got -0.1"),
        (torch.ones(2, 5), dict(ratio=float("nan")), ValueError, "ratio: got nan"),
        (torch.ones(2, 5), dict(ratio="half"), TypeError, "ratio: got str"),
        (torch.ones(2, 5), dict(k=6), ValueError, r"k: got 6, expected an integer in \[0, 5\]"),
        (torch.ones(2, 5), dict(k=-1), ValueError, "k: got -1"),
        (torch.ones(2, 5), dict(k=2.0), TypeError, "k: got float 2.0, expected a python int"),
        (torch.ones(5), dict(k=1), ValueError, r"scores: got shape \(5,\) \(1-d\), expected \[B, N\]"),
        (torch.ones(2, 5, 1), dict(k=1), ValueError, r"scores: got shape \(2, 5, 1\)"),
        (torch.ones(2, 5, dtype=torch.int64), dict(k=1), TypeError, "scores: got dtype torch.int64"),
    ],
)
def test_bad_input(scores, how, error, match):
    for op in (ops.topk_mask, ops.topk_indices):
        with pytest.raises(error, match=match):
            op(scores, **how)
