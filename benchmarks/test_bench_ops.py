"""pytest-benchmark version of `margrpo bench ops`: eager PyTorch, torch.compile and every margrpo
backend side by side, one benchmark group per op, shape and mode (forward, backward alone, forward +
backward; see margrpo.bench.ops).

    python -m pytest benchmarks/test_bench_ops.py --benchmark-group-by=group
    MARGRPO_BENCH_SHAPES=nova,steps MARGRPO_BENCH_ROUNDS=50 python -m pytest benchmarks/test_bench_ops.py

Each test first checks that the implementation agrees with eager on the same inputs (and gradients).
Every case runs a fixed number of rounds (MARGRPO_BENCH_ROUNDS, default 20) of one call each after 3
warm-up rounds, so its min / median / IQR describe a spread; a backward case runs its forward as the
untimed setup of each round.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from margrpo.bench import ops as bench

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = tuple(s for s in os.environ.get("MARGRPO_BENCH_SHAPES", ",".join(bench.SHAPES)).split(",") if s)
ROUNDS = int(os.environ.get("MARGRPO_BENCH_ROUNDS", "20"))
WARMUP_ROUNDS = 3


@functools.cache
def _implementations(op: str) -> dict:
    return bench.implementations(op, DEVICE)


def _modes(op: str) -> tuple[str, ...]:
    return bench.MODES if op in bench.GRAD_INPUTS else ("forward",)


CASES = [
    (op, shape, mode, impl)
    for op in bench.OPS
    for shape in SHAPES
    for mode in _modes(op)
    for impl in _implementations(op)
    if mode == "forward" or bench.differentiable(impl)
]


@pytest.mark.parametrize("op,shape,mode,impl", CASES, ids=["-".join(case) for case in CASES])
def test_bench_op(benchmark, op, shape, mode, impl):
    benchmark.group = f"{op} {shape} {mode}"
    benchmark.extra_info["dims"] = list(bench.SHAPES[shape])
    inputs = bench.make_inputs(op, bench.SHAPES[shape], DEVICE)
    impls = _implementations(op)
    expected = impls["eager"](inputs)
    primary = bench.primary(expected)
    # a gradient for differentiable outputs only (the composite's primary output is a bool mask)
    grad_out = torch.randn_like(primary) if primary.ndim and primary.is_floating_point() else None
    grad_inputs = bench.GRAD_INPUTS.get(op, ())
    timed = bench.mode_call(mode, impls[impl], inputs, grad_inputs, grad_out)
    reference = bench.mode_call(mode, impls["eager"], inputs, grad_inputs, grad_out)
    got, want = (t.call(t.setup()) if t.setup else t.call() for t in (timed, reference))
    if mode == "forward":
        bench.assert_agrees(op, got, want)
    else:
        bench.assert_grads_agree(op, got if mode == "backward" else got[1], want if mode == "backward" else want[1])

    def setup():
        state = timed.setup() if timed.setup else None
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return ((state,) if timed.setup else ()), {}

    def call(*state):
        out = timed.call(*state)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return out

    benchmark.pedantic(call, setup=setup, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS, iterations=1)
