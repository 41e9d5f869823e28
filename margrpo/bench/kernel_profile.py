"""What a torch.profiler trace says about a step: the kernels that take its time, how many it
launched, and how much of the step the device was busy.

The busy fraction answers the question a low MFU raises: a device busy 95% of the step runs slow
kernels (look at the top of the table), one busy 30% waits for the host (launch overhead, syncs,
Python), which no kernel can fix. On a CPU there is no device: the table lists the ATen operators by
their own CPU time, and the busy fraction is not defined.

    with torch.profiler.profile(activities=activities(device)) as prof:
        step()
    summary = summarize(prof.events(), wall_s, device, top=30)
"""

from __future__ import annotations

import collections

import torch

# the runtime and driver calls that put one kernel on the device's queue
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"})


def activities(device: torch.device) -> list:
    """The profiler activities for a step on `device`: on CUDA the GPU's activity alone (its kernels
    and the runtime calls that launched them; the host's operator events, which the summary does not
    read, would multiply the trace a NOVA step makes), on a CPU the host's operators."""
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]


def _on_device(event) -> bool:
    return event.device_type == torch.autograd.DeviceType.CUDA


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of [start, end) intervals (kernels of several streams overlap)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered


def summarize(events, wall_s: float, device: torch.device, top: int = 30) -> dict:
    """From a profile's events (prof.events()) of a step that took wall_s seconds: the `top` kernels
    by device time (CUDA) or ATen operators by own CPU time (CPU) with their calls and share; the
    launches; the device's busy time and busy fraction (CUDA only)."""
    total_us: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    intervals, launches = [], 0
    for event in events:
        if event.name in LAUNCH_CALLS:
            launches += 1
        if device.type == "cuda":
            if not _on_device(event):
                continue
            duration = event.time_range.end - event.time_range.start
            intervals.append((event.time_range.start, event.time_range.end))
        else:
            if _on_device(event) or not event.name.startswith("aten::"):
                continue
            duration = event.self_cpu_time_total
        total_us[event.name] += duration
        calls[event.name] += 1
    measured = sum(total_us.values())
    rows = [
        {"name": name, "calls": calls[name], "ms": us / 1e3, "share": us / measured if measured else 0.0}
        for name, us in total_us.most_common(top)
    ]
    summary = {
        "what": "kernels by device time" if device.type == "cuda" else "ATen operators by own CPU time",
        "wall_s": wall_s,
        "measured_ms": measured / 1e3,
        "distinct": len(total_us),
        "calls": sum(calls.values()),
        "launches": launches if device.type == "cuda" else None,
        "top": rows,
    }
    if device.type == "cuda":
        busy = busy_us(intervals) / 1e6
        summary.update(device_busy_s=busy, device_busy_fraction=busy / wall_s if wall_s > 0 else 0.0)
    return summary


def format_summary(summary: dict, rows: int = 15) -> str:
    lines = [f"{summary['what']}: {summary['calls']} calls of {summary['distinct']} kinds, {summary['measured_ms']:.1f} ms"]
    if summary.get("device_busy_fraction") is not None:
        lines.append(
            f"device busy {summary['device_busy_s']:.3f} s of the step's {summary['wall_s']:.3f} s "
            f"({100 * summary['device_busy_fraction']:.0f}%), {summary['launches']} launches"
        )
    lines.append("| name | calls | ms | share |")
    lines.append("|---|---:|---:|---:|")
    lines += [f"| {r['name'][:90]} | {r['calls']} | {r['ms']:.2f} | {100 * r['share']:.1f}% |" for r in summary["top"][:rows]]
    return "\n".join(lines)
