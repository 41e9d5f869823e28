"""pytest-benchmark version of `margrpo bench ops`: eager PyTorch, torch.compile and every margrpo
backend side by side, one benchmark group per op and shape.

    python -m pytest benchmarks/test_bench_ops.py --benchmark-group-by=group
    MARGRPO_BENCH_SHAPES=nova,steps python -m pytest benchmarks/test_bench_ops.py

Each test first checks that the implementation agrees with eager on the same inputs.
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

from margrpo.bench import ops as bench

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SHAPES = tuple(s for s in os.environ.get("MARGRPO_BENCH_SHAPES", ",".join(bench.SHAPES)).split(",") if s)


@functools.cache
def _implementations(op: str) -> dict:
    return bench.implementations(op, DEVICE)


CASES = [(op, shape, impl) for op in bench.OPS for shape in SHAPES for impl in _implementations(op)]


@pytest.mark.parametrize("op,shape,impl", CASES, ids=[f"{o}-{s}-{i}" for o, s, i in CASES])
def test_bench_op(benchmark, op, shape, impl):
    benchmark.group = f"{op} {shape}"
    benchmark.extra_info["dims"] = list(bench.SHAPES[shape])
    inputs = bench.make_inputs(op, bench.SHAPES[shape], DEVICE)
    impls = _implementations(op)
    bench.assert_agrees(op, impls[impl](inputs), impls["eager"](inputs))
    fn = impls[impl]

    def call():
        out = fn(inputs)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        return out

    benchmark(call)
