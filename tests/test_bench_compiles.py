"""margrpo.bench.compiles: JIT compiles inside timed calls are counted per method, by the timing
helper every benchmark uses, and nothing outside the timed calls is."""

from __future__ import annotations

import pytest
import torch

from margrpo.bench import compiles
from margrpo.bench.timing import Timed, interleave

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiling_method():
    """A method whose first call compiles a torch.compile graph (later calls reuse it)."""
    fn = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="eager")
    x = torch.randn(8)
    return lambda: fn(x)


def test_a_graph_compiled_inside_a_timed_call_is_counted_for_its_method():
    timed = interleave(
        {"compiles": _compiling_method(), "plain": lambda: torch.randn(8).sum()}, CPU, min_time_s=0.0, warmup=0, min_rounds=3, max_rounds=3
    )
    assert timed.compiles["compiles"]["graphs"] == 1
    assert timed.compiles["plain"] == {"triton": 0, "graphs": 0, "kernels": []}
    lines = compiles.warn_if_compiled(timed.compiles, "[bench]")
    assert len(lines) == 1 and "[bench] compiles" in lines[0] and "1 torch.compile graph" in lines[0]


def test_warm_up_and_setup_compiles_are_not_counted():
    warmed = interleave({"m": _compiling_method()}, CPU, min_time_s=0.0, warmup=1, min_rounds=2, max_rounds=2)
    assert warmed.compiles["m"]["graphs"] == 0
    torch._dynamo.reset()
    method = _compiling_method()
    in_setup = interleave({"m": Timed(lambda state: None, setup=method)}, CPU, min_time_s=0.0, warmup=0, min_rounds=2, max_rounds=2)
    assert in_setup.compiles["m"]["graphs"] == 0  # the setup compiled it, untimed
    assert compiles.warn_if_compiled(in_setup.compiles, "[bench]") == []


def test_triton_compiles_are_counted_through_its_hook_and_the_previous_hook_is_kept():
    """Triton calls knobs.runtime.jit_post_compile_hook after compiling a kernel variant (a GPU is
    needed for a real compile, so the hook is called here as Triton calls it)."""
    knobs = pytest.importorskip("triton").knobs
    seen = []
    previous = knobs.runtime.jit_post_compile_hook

    def user_hook(**kwargs):
        seen.append(kwargs["key"])

    class Info:  # what Triton passes as fn (triton.runtime.jit.JitFunctionInfo)
        name = "_ln_modulate_kernel"

    def compiles_a_kernel():
        knobs.runtime.jit_post_compile_hook(key="k", fn=Info(), compile={}, is_manual_warmup=False, already_compiled=False, repr="")

    knobs.runtime.jit_post_compile_hook = user_hook
    try:
        timed = interleave(
            {"fused": compiles_a_kernel, "reference": lambda: None}, CPU, min_time_s=0.0, warmup=0, min_rounds=2, max_rounds=2
        )
        assert timed.compiles["fused"] == {"triton": 2, "graphs": 0, "kernels": ["_ln_modulate_kernel"]}
        assert timed.compiles["reference"]["triton"] == 0
        assert seen == ["k", "k"]  # the user's hook still ran
        assert knobs.runtime.jit_post_compile_hook is user_hook  # and is back in place afterwards
    finally:
        knobs.runtime.jit_post_compile_hook = previous
