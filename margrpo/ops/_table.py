"""The measured backend order of `auto`: per op, device kind and size bucket.

The table (margrpo/ops/backend_table.json, shipped with the package; env MARGRPO_BACKEND_TABLE or
`set_backend_table(path)` name another file) holds, for an op on a device kind, size buckets of the
op's main input in elements ([min_elements, max_elements), max null = no bound), each with the
backends fastest first as `margrpo bench ops` measured them there (`--write-table`, written by
margrpo.bench.table). `auto` takes the first usable backend of the bucket's order. An op, device kind
or size the table does not cover keeps the built-in rule of _backend.

Device kinds: cpu, nvidia-h100, nvidia-h200, other-cuda (every other CUDA device). The main input is
the first tensor the op's kernels take (gaussian_logprob x, trajectory_std samples, topk scores,
consistency prev, grpo_surrogate logp, ln_modulate x, gate_residual residual), in the kernel layout.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

FORMAT = 1
DEVICE_KINDS = ("cpu", "nvidia-h100", "nvidia-h200", "other-cuda")
OPS = (
    "gaussian_logprob",
    "trajectory_std",
    "topk_mask",
    "topk_indices",
    "consistency_mask",
    "grpo_surrogate",
    "ln_modulate",
    "gate_residual",
)
BACKENDS = ("torch", "triton", "cuda", "cpp")
PACKAGED = Path(__file__).with_name("backend_table.json")
ENV = "MARGRPO_BACKEND_TABLE"


def kind_from_name(device_type: str, gpu_name: str | None = None) -> str | None:
    """The table's device kind of a device type and (CUDA) GPU name, e.g. "NVIDIA H200" ->
    nvidia-h200; None for device types the table has no kind for (meta, mps, ...)."""
    if device_type == "cpu":
        return "cpu"
    if device_type != "cuda":
        return None
    name = (gpu_name or "").upper()
    for model in ("H100", "H200"):
        if model in name:
            return f"nvidia-{model.lower()}"
    return "other-cuda"


@functools.cache
def device_kind(device: torch.device) -> str | None:
    """The device kind of `device` (asks CUDA for the GPU's name once per device)."""
    if device.type != "cuda":
        return kind_from_name(device.type)
    return kind_from_name("cuda", torch.cuda.get_device_name(device) if torch.cuda.is_available() else None)


@dataclass(frozen=True)
class Bucket:
    min_elements: int
    max_elements: int | None  # exclusive; None: no upper bound
    order: tuple[str, ...]


class Table:
    """A checked table: (op, device kind) -> its buckets, sorted by size and not overlapping."""

    def __init__(self, buckets: dict[tuple[str, str], list[Bucket]], source: str):
        self.source = source
        self._buckets = buckets
        # per (op, kind): the sorted bucket edges and, for each segment between two edges, the
        # order of the bucket covering it (None in a gap), so a lookup is one bisect
        self._segments: dict[tuple[str, str], tuple[tuple[int, ...], tuple[tuple[str, ...] | None, ...]]] = {}
        for key, found in buckets.items():
            edges = sorted({b.min_elements for b in found} | {b.max_elements for b in found if b.max_elements is not None})
            orders = [None]  # below the first edge
            for lo in edges:
                covering = (b.order for b in found if b.min_elements <= lo and (b.max_elements is None or lo < b.max_elements))
                orders.append(next(covering, None))
            self._segments[key] = (tuple(edges), tuple(orders))

    def segments(self, op: str, kind: str | None) -> tuple[tuple[int, ...], tuple[tuple[str, ...] | None, ...]]:
        """(edges, orders): a size n lies in segment bisect_right(edges, n), whose order is
        orders[segment] (None: not covered). No entry for (op, kind): ((), (None,))."""
        return self._segments.get((op, kind), ((), (None,)))

    def order(self, op: str, kind: str | None, elements: int | None) -> tuple[str, ...] | None:
        """The measured order for `op` on `kind` at `elements`, or None where the table has none.
        elements None (a size unknown while tracing): the order every bucket agrees on, if any."""
        edges, orders = self.segments(op, kind)
        if elements is None:
            covered = {o for o in orders if o is not None}
            return covered.pop() if len(covered) == 1 and None not in orders[1:] else None
        return orders[bisect.bisect_right(edges, elements)]

    def entries(self) -> dict[tuple[str, str], list[Bucket]]:
        return {key: list(found) for key, found in self._buckets.items()}


def _fail(source: str, where: str, got: object, expected: str) -> ValueError:
    return ValueError(f"backend table {source}: {where}: got {got!r}, expected {expected}")


def parse(data: object, source: str) -> Table:
    """A Table from the JSON value `data`; ValueError naming the file, the entry and the field."""
    if not isinstance(data, dict):
        raise _fail(source, "the top level", type(data).__name__, "a JSON object with 'format' and 'entries'")
    if data.get("format") != FORMAT:
        raise _fail(source, "format", data.get("format"), f"{FORMAT}")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise _fail(source, "entries", type(entries).__name__, "a list of {op, device, min_elements, max_elements, order}")
    buckets: dict[tuple[str, str], list[Bucket]] = {}
    for i, entry in enumerate(entries):
        where = f"entries[{i}]"
        if not isinstance(entry, dict):
            raise _fail(source, where, type(entry).__name__, "a JSON object")
        op, kind = entry.get("op"), entry.get("device")
        if op not in OPS:
            raise _fail(source, f"{where}.op", op, f"one of {', '.join(OPS)}")
        if kind not in DEVICE_KINDS:
            raise _fail(source, f"{where}.device", kind, f"one of {', '.join(DEVICE_KINDS)}")
        lo, hi = entry.get("min_elements"), entry.get("max_elements")
        if isinstance(lo, bool) or not isinstance(lo, int) or lo < 0:
            raise _fail(source, f"{where}.min_elements", lo, "an integer >= 0")
        if hi is not None and (isinstance(hi, bool) or not isinstance(hi, int) or hi <= lo):
            raise _fail(source, f"{where}.max_elements", hi, f"null (no bound) or an integer > min_elements ({lo})")
        order = entry.get("order")
        if not isinstance(order, list) or not order or any(b not in BACKENDS for b in order) or len(set(order)) != len(order):
            raise _fail(source, f"{where}.order", order, f"a non-empty list of distinct backends from {', '.join(BACKENDS)}")
        bucket = Bucket(lo, hi, tuple(order))
        for other in buckets.get((op, kind), []):
            if lo < (other.max_elements if other.max_elements is not None else float("inf")) and other.min_elements < (
                hi if hi is not None else float("inf")
            ):
                raise _fail(
                    source,
                    f"{where} ({op} on {kind})",
                    [lo, hi],
                    f"a size range that overlaps no other entry's (it overlaps [{other.min_elements}, {other.max_elements}])",
                )
        buckets.setdefault((op, kind), []).append(bucket)
    return Table(buckets, source)


def load(path: str | os.PathLike) -> Table:
    """Read and check a table file; errors name the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(
            f"backend table {path}: cannot be read ({err.strerror or err}); expected a JSON file "
            f"written by `margrpo bench ops --write-table` (env {ENV})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"backend table {path}: not valid JSON ({err})") from None
    return parse(data, str(path))


_table: Table | None = None
_path: str | None = None  # None: env MARGRPO_BACKEND_TABLE, else the packaged file
_on_change: list[Callable[[], None]] = []


def current() -> Table:
    """The table `auto` follows (loaded once, on first use)."""
    global _table
    if _table is None:
        _table = load(_path or os.environ.get(ENV) or PACKAGED)
    return _table


def on_change(callback: Callable[[], None]) -> None:
    """Call `callback` whenever the table is replaced (caches of picks register here)."""
    _on_change.append(callback)


def set_backend_table(path: str | os.PathLike | None) -> None:
    """Follow the table at `path` from now on (None: env MARGRPO_BACKEND_TABLE, else the packaged
    one). The file is read and checked here, so a bad table fails at this call."""
    global _table, _path
    table = load(path or os.environ.get(ENV) or PACKAGED)
    _table, _path = table, (str(path) if path else None)
    for callback in _on_change:
        callback()


@contextlib.contextmanager
def use_backend_table(path: str | os.PathLike):
    """Temporarily follow another table (tests, benchmarks)."""
    previous = _path
    set_backend_table(path)
    try:
        yield
    finally:
        set_backend_table(previous)
