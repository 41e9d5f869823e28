"""Timing shared by the benchmarks: the compared methods run interleaved, round after round.

Timing one method after another lets the load of a shared machine (or a GPU's clocks) drift between
them: a ratio moved from 1.70x to 3.35x between two runs that way. Here every round calls each
method once, in a fresh seeded random order (in a fixed order a method always follows the same
other one, and reusing that one's just-freed buffers made it up to 1.6x faster by position alone),
so every method sees the same conditions. A ratio between two methods is taken per round (the two
calls of one round ran moments apart, under the same load) and summarised by the median and the
20th / 80th percentiles of those paired ratios: it holds when the absolute times do not.

A method may have an untimed `setup` run just before each of its timed calls (a backward pass
needs a fresh forward graph, which must not count). JIT compiles inside the timed calls (a Triton
kernel variant or a torch.compile graph the warm-up did not build) are counted per method
(margrpo.bench.compiles), so a report can say its figures are clean.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .compiles import CompileWatch

# the clock around each timed CPU call (tests replace it to see what falls inside the timed region)
_now = time.perf_counter


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Timed:
    """A timed call, with an optional untimed setup run before each call (its result is passed on)."""

    call: Callable[..., object]
    setup: Callable[[], object] | None = None


@dataclass(frozen=True)
class Stats:
    """Percentiles of a list of samples (ms, or ratios)."""

    p20: float
    p50: float
    p80: float
    min: float
    n: int


def stats(samples: list[float]) -> Stats:
    """p20 / p50 / p80 (linear interpolation between order statistics) and the minimum."""
    if not samples:
        raise ValueError("samples: got an empty list, expected at least one measurement")
    if len(samples) == 1:
        only = samples[0]
        return Stats(only, only, only, only, 1)
    cuts = statistics.quantiles(samples, n=10, method="inclusive")  # deciles: cuts[1] = p20, cuts[7] = p80
    return Stats(cuts[1], statistics.median(samples), cuts[7], min(samples), len(samples))


@dataclass
class Interleaved:
    """Per-method times (ms) of every round and the order the methods ran in each round."""

    times: dict[str, list[float]]
    order: list[list[str]]
    # per method: {"triton": kernel variants, "graphs": torch.compile graphs, "kernels": names} compiled
    # inside its timed calls (zeros when the warm-up covered everything)
    compiles: dict[str, dict] = field(default_factory=dict)

    def stats(self, name: str) -> Stats:
        return stats(self.times[name])

    def ratio_samples(self, base: str, name: str) -> list[float]:
        """base / name of every round (> 1: `name` is faster than `base`)."""
        return [b / t if t > 0 else float("inf") for b, t in zip(self.times[base], self.times[name])]

    def ratio(self, base: str, name: str) -> Stats:
        """Percentiles of base / name taken round by round (> 1: `name` is faster than `base`)."""
        return stats(self.ratio_samples(base, name))


def _call_ms(timed: Timed, device: torch.device, clock: Callable[[], float] | None, watch: CompileWatch, name: str) -> float:
    state = timed.setup() if timed.setup else None
    args = () if timed.setup is None else (state,)
    watch.start(name)  # after the setup: its compiles are not the timed call's
    try:
        if device.type == "cuda":
            synchronize(device)  # the setup's queued work must not land in the timed region
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            timed.call(*args)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        now = clock or _now
        begin = now()
        timed.call(*args)
        return (now() - begin) * 1e3
    finally:
        watch.stop()


def interleave(
    fns: dict[str, Timed | Callable[[], object]],
    device: torch.device,
    min_time_s: float = 0.3,
    warmup: int = 3,
    min_rounds: int = 10,
    max_rounds: int = 2000,
    seed: int = 0,
    clock: Callable[[], float] | None = None,
) -> Interleaved:
    """Time every method in rounds, each round calling each method once in a shuffled order.

    After `warmup` untimed calls of each, rounds continue until about min_time_s per method has
    passed (at least min_rounds, at most max_rounds). CPU: perf_counter (or `clock`, seconds: e.g.
    time.thread_time, where the wait for a core on a shared machine is not the method's cost); CUDA:
    events around each call. The garbage collector is off while timing (as in timeit): collecting torch's object
    graph is not a method's cost."""
    if min_rounds < 1 or max_rounds < min_rounds:
        raise ValueError(f"min_rounds, max_rounds: got {min_rounds}, {max_rounds}, expected 1 <= min_rounds <= max_rounds")
    methods = {name: fn if isinstance(fn, Timed) else Timed(fn) for name, fn in fns.items()}
    for timed in methods.values():
        for _ in range(warmup):
            timed.call(*(() if timed.setup is None else (timed.setup(),)))
    synchronize(device)
    result = Interleaved({name: [] for name in methods}, [])
    names = list(methods)
    shuffle = random.Random(seed).shuffle
    budget = min_time_s * len(methods)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with CompileWatch() as watch:
            start_all = time.monotonic()
            while len(result.order) < min_rounds or (time.monotonic() - start_all < budget and len(result.order) < max_rounds):
                shuffle(names)
                result.order.append(list(names))
                for name in names:
                    result.times[name].append(_call_ms(methods[name], device, clock, watch, name))
        result.compiles = {name: watch.report(name) for name in methods}
    finally:
        if gc_was_enabled:
            gc.enable()
    return result


def interleaved_ms(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    min_time_s: float = 0.3,
    warmup: int = 3,
    min_rounds: int = 10,
    max_rounds: int = 2000,
) -> dict[str, tuple[float, float]]:
    """(median, min) milliseconds of each fn() over interleaved rounds (see `interleave`)."""
    timed = interleave(fns, device, min_time_s, warmup, min_rounds, max_rounds)
    return {name: (statistics.median(t), min(t)) for name, t in timed.times.items()}


def median_ms(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median ms of each fn over exactly `repeats` interleaved rounds after `warmup` calls of each
    (for methods that take seconds: rollouts, training steps)."""
    timed = interleaved_ms(fns, device, min_time_s=0.0, warmup=warmup, min_rounds=repeats, max_rounds=repeats)
    return {name: median for name, (median, _) in timed.items()}
