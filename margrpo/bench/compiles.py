"""JIT compiles that land inside timed calls: Triton kernels and torch.compile graphs.

A benchmark warms each method up on a short schedule, then times the real one. Whatever the warm-up
did not compile (a Triton kernel variant, a torch.compile graph for a shape it never saw) compiles
inside a timed call and is counted as the method's cost: seconds, against steps of seconds. The
timing helpers (margrpo.bench.timing) watch every timed call and report, per method, how many
compiles it contained, so a figure says whether it is clean.

Triton: its post-compile hook (`triton.knobs.runtime.jit_post_compile_hook`, Triton >= 3.4; chained
to any hook already installed) fires when a kernel variant is not in the process's memory, which
includes a load from Triton's disk cache (cheaper, but still not steady state). torch.compile: the
graphs Dynamo compiled (`counters["stats"]["unique_graphs"]`). Kernels of margrpo's C++/CUDA
extension are compiled ahead of time and never appear.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field


def _knobs():
    try:
        from triton import knobs
    except ImportError:  # no Triton, or one without knobs (< 3.4): its compiles go uncounted
        return None
    return knobs if hasattr(knobs.runtime, "jit_post_compile_hook") else None


@functools.cache
def _dynamo_counters():
    """Dynamo's counters (imported on first use: torch._dynamo takes a second to import, and a watch
    reads them twice around every timed call)."""
    from torch._dynamo.utils import counters

    return counters


def _graphs() -> int:
    return _dynamo_counters()["stats"]["unique_graphs"]  # "stats" anew each time: clear() replaces it


@dataclass
class CompileWatch:
    """While entered, counts Triton kernel compiles and Dynamo graphs per method, for the calls made
    between `start(method)` and `stop()`; compiles outside such a window are not counted."""

    triton: Counter = field(default_factory=Counter)
    graphs: Counter = field(default_factory=Counter)
    kernels: dict[str, set[str]] = field(default_factory=dict)
    _current: str | None = None
    _graphs_at_start: int = 0
    _previous_hook: object = None
    _knobs: object = None

    def __enter__(self) -> CompileWatch:
        self._knobs = _knobs()
        if self._knobs is not None:
            self._previous_hook = self._knobs.runtime.jit_post_compile_hook
            self._knobs.runtime.jit_post_compile_hook = self._on_triton_compile
        return self

    def __exit__(self, *exc) -> None:
        if self._knobs is not None:
            self._knobs.runtime.jit_post_compile_hook = self._previous_hook
        self._current = None

    def _on_triton_compile(self, **kwargs):
        if self._current is not None:
            self.triton[self._current] += 1
            fn = kwargs.get("fn")
            self.kernels.setdefault(self._current, set()).add(getattr(fn, "name", None) or str(fn))
        if self._previous_hook is not None:
            return self._previous_hook(**kwargs)
        return None

    def start(self, method: str) -> None:
        self._current, self._graphs_at_start = method, _graphs()

    def stop(self) -> None:
        if self._current is not None:
            self.graphs[self._current] += _graphs() - self._graphs_at_start
        self._current = None

    def report(self, method: str) -> dict:
        """{"triton": kernel variants compiled, "graphs": torch.compile graphs, "kernels": their names}
        inside `method`'s timed calls."""
        return {"triton": self.triton[method], "graphs": self.graphs[method], "kernels": sorted(self.kernels.get(method, ()))}


def warn_if_compiled(compiles: dict[str, dict], what: str) -> list[str]:
    """Printable warnings for the methods whose timed calls compiled something (empty when clean)."""
    lines = []
    for method, seen in compiles.items():
        if seen["triton"] or seen["graphs"]:
            kernels = f" ({', '.join(seen['kernels'])})" if seen["kernels"] else ""
            lines.append(
                f"warning: {what} {method}: its timed calls compiled {seen['triton']} Triton kernel variant(s){kernels} "
                f"and {seen['graphs']} torch.compile graph(s); the time includes them (a longer warm-up would not)"
            )
    return lines
