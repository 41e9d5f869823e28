"""Timing shared by the benchmarks: the compared methods run interleaved, round after round.

Timing one method after another lets the load of a shared machine (or a GPU's clocks) drift between
them: a ratio moved from 1.70x to 3.35x between two runs that way. Here every round calls each
method once, in a fresh seeded random order (in a fixed order a method always follows the same
other one, and reusing that one's just-freed buffers made it up to 1.6x faster by position alone),
so every method sees the same conditions and the ratios hold when the absolute times do not.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call_ms(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def interleaved_ms(fns: dict[str, Callable[[], object]], device: torch.device, min_time_s: float = 0.3,
                   warmup: int = 3, min_rounds: int = 10, max_rounds: int = 2000) -> dict[str, tuple[float, float]]:
    """(median, min) milliseconds of each fn() over interleaved rounds, after `warmup` calls of each.

    Rounds continue until about min_time_s per function has passed (at least min_rounds, at most
    max_rounds). CPU: perf_counter; CUDA: events around each call. The garbage collector is off
    while timing (as in timeit): collecting torch's object graph is not a method's cost."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    shuffle = random.Random(0).shuffle
    budget = min_time_s * len(fns)
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        start_all = time.perf_counter()
        rounds = 0
        while rounds < min_rounds or (time.perf_counter() - start_all < budget and rounds < max_rounds):
            shuffle(order)
            for name, fn in order:
                times[name].append(_call_ms(fn, device))
            rounds += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def median_ms(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
              warmup: int = 1) -> dict[str, float]:
    """Median ms of each fn over exactly `repeats` interleaved rounds after `warmup` calls of each
    (for methods that take seconds: rollouts, training steps)."""
    timed = interleaved_ms(fns, device, min_time_s=0.0, warmup=warmup, min_rounds=repeats, max_rounds=repeats)
    return {name: median for name, (median, _) in timed.items()}
