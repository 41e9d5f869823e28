"""What every benchmark shares: a description of the machine the numbers came from (with its load:
the project machines are shared), the parsing of comma-list CLI options, and the JSON report
written as rows arrive."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): a number measured at load
    4 on 2 cores says little about the op."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def machine_description(device: torch.device) -> dict[str, object]:
    """What the numbers were measured on: CPU model and cores, threads used, versions, GPU, load."""
    import margrpo

    info: dict[str, object] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "margrpo": margrpo.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "load_average": load_average(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def header(info: dict[str, object]) -> str:
    """The lines printed above a benchmark's table: versions, hardware, load."""
    load = info.get("load_average")
    load_text = " ".join(f"{v:.2f}" for v in load) if load else "unavailable"
    hardware = f"CPU {info['cpu']} ({info['cpu_count']} cores, {info['torch_threads']} torch threads)"
    if "gpu" in info:
        hardware += f", GPU {info['gpu']}"
    return (
        f"torch {info['torch']}, triton {info['triton'] or 'not installed'}, margrpo {info['margrpo']}, "
        f"python {info['python']}\n{hardware}, device {info['device']}\n"
        f"load average (1/5/15 min) {load_text} at the start"
    )


def split_choices(value: str, allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    """A CLI option's comma list, each item one of `allowed` (else exit naming --name)."""
    items = tuple(v for v in value.split(",") if v)
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise SystemExit(f"--{name}: got {value!r}, expected a comma list of {', '.join(allowed)}")
    return items


class JsonReport:
    """A benchmark's JSON file, rewritten after every new row: a run cut short by a time limit keeps
    every row it finished. {"machine": ..., **meta, "rows": [...]}; no file when path is None."""

    def __init__(self, path: str | None, device: torch.device, **meta: object):
        self.path, self.rows = path, []
        self.head = {"machine": machine_description(device), **meta}

    def add(self, *rows: dict) -> None:
        self.rows.extend(rows)
        self._write()

    def set(self, key: str, value: object) -> None:
        """A top-level entry beside the rows (rewritten like them)."""
        self.head[key] = value
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        partial = f"{self.path}.partial"
        with open(partial, "w") as f:
            json.dump({**self.head, "rows": self.rows}, f, indent=1)
        os.replace(partial, self.path)  # never a half-written file
