"""What every benchmark shares: a description of the machine the numbers came from, the parsing of
comma-list CLI options, and the JSON report written as rows arrive."""
from __future__ import annotations

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


def machine_description(device: torch.device) -> dict[str, object]:
    """What the numbers were measured on: CPU model and cores, threads used, versions, GPU."""
    info: dict[str, object] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


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
        if self.path is None:
            return
        partial = f"{self.path}.partial"
        with open(partial, "w") as f:
            json.dump({**self.head, "rows": self.rows}, f, indent=1)
        os.replace(partial, self.path)  # never a half-written file
