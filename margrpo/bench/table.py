"""From `margrpo bench ops` results to the backend table of margrpo.ops (`--write-table`), and the
verdicts the bench report states: where no margrpo backend beats eager or torch.compile.

A bench row times one implementation of a bench op at one shape [D0, B, N, C] and mode. Per public
op, device kind and shape, the margrpo backends are ranked by their speedup over eager (the rows'
per-round paired ratio), as the geometric mean over the modes and runs measured; the table's size
buckets are the measured sizes of the op's main input, split at the geometric midpoints between them
(the first from 0, the last without bound). Rows from older bench JSON (median_ms, no mode) read as
forward rows.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from margrpo.ops import _table

# bench op -> the public ops it times, each with its main input's elements at bench dims [D0, B, N, C]
PUBLIC_OPS = {
    "gaussian_logprob": (("gaussian_logprob", lambda d0, b, n, c: d0 * b * n * c),),
    "trajectory_std+topk_mask": (("trajectory_std", lambda d0, b, n, c: d0 * b * n * c), ("topk_mask", lambda d0, b, n, c: b * n)),
    "consistency_mask": (("consistency_mask", lambda d0, b, n, c: d0 * b * n * c),),
    "grpo_surrogate": (("grpo_surrogate", lambda d0, b, n, c: d0 * b * n),),
}


def _backend_of(impl: str) -> str | None:
    return impl[len("margrpo[") : -1] if impl.startswith("margrpo[") and impl.endswith("]") else None


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def device_kind_of(report: dict) -> str:
    """The device kind of a bench JSON report (its rows' device and the machine's GPU name)."""
    rows = report.get("rows") or []
    device = str(rows[0].get("device", "cpu")) if rows else str(report.get("machine", {}).get("device", "cpu"))
    kind = _table.kind_from_name(device.split(":")[0], report.get("machine", {}).get("gpu"))
    if kind is None:
        raise ValueError(f"bench rows on device {device!r}: expected cpu or cuda rows, the table's device kinds")
    return kind


def speedups(reports: Iterable[dict]) -> dict[tuple[str, str, tuple[int, ...]], dict[str, float]]:
    """(device kind, bench op, dims) -> impl -> speedup over eager, the geometric mean over the
    modes and reports that measured it."""
    found: dict[tuple[str, str, tuple[int, ...]], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for report in reports:
        kind = device_kind_of(report)
        for i, row in enumerate(report.get("rows") or []):
            try:
                op, dims, impl, speedup = row["op"], tuple(row["dims"]), row["impl"], float(row["speedup"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(
                    f"bench rows[{i}]: got {row!r}, expected op, dims, impl and speedup (the rows of `margrpo bench ops --json`)"
                ) from None
            if op in PUBLIC_OPS and len(dims) == 4 and speedup > 0:
                found[(kind, op, dims)][impl].append(speedup)
    return {key: {impl: _geomean(v) for impl, v in impls.items()} for key, impls in found.items()}


Measured = dict[tuple[str, str], dict[int, dict]]  # (op, device kind) -> main-input elements -> order, figures


def measurements(reports: Iterable[dict]) -> Measured:
    """The backends' order at each measured size, per public op and device kind, with the figures.
    Shapes that give one public op the same main-input size (topk_mask's [B, N] under any D0) are
    one measurement: their speedups are averaged (geometric mean)."""
    by_size: dict[tuple[str, str, int], dict] = defaultdict(lambda: {"dims": [], "impls": defaultdict(list)})
    for (kind, bench_op, dims), impls in speedups(reports).items():
        for op, elements_of in PUBLIC_OPS[bench_op]:
            found = by_size[(op, kind, elements_of(*dims))]
            found["dims"].append(list(dims))
            for impl, speedup in impls.items():
                found["impls"][impl].append(speedup)
    measured: Measured = defaultdict(dict)
    for (op, kind, elements), found in by_size.items():
        impls = {impl: _geomean(v) for impl, v in found["impls"].items()}
        backends = {b: s for impl, s in impls.items() if (b := _backend_of(impl))}
        if not backends:
            continue
        order = sorted(backends, key=lambda b: -backends[b])
        best = backends[order[0]]
        measured[(op, kind)][elements] = {
            "order": order,
            "measured": {
                "dims": sorted(found["dims"]),
                "elements": elements,
                "speedup_vs_eager": {k: round(v, 3) for k, v in sorted(impls.items())},
                "beats_eager": best > 1.0,
                "beats_compile": best > impls["compile"] if "compile" in impls else None,
            },
        }
    return dict(measured)


def bucketed(measured: Measured) -> list[dict]:
    """Table entries: each measured size owns the sizes up to the geometric midpoints with its
    neighbours (the smallest from 0, the largest without bound)."""
    out = []
    for (op, kind), sized in sorted(measured.items()):
        sizes = sorted(sized)
        edges = [0] + [math.isqrt(a * b) + 1 for a, b in zip(sizes, sizes[1:])] + [None]
        for i, size in enumerate(sizes):
            out.append({"op": op, "device": kind, "min_elements": edges[i], "max_elements": edges[i + 1], **sized[size]})
    return out


def entries(reports: Iterable[dict]) -> list[dict]:
    """Table entries (margrpo.ops._table's layout, with what was measured) from bench reports."""
    return bucketed(measurements(reports))


def write(path: str | Path, reports: list[dict], sources: list[str], keep: bool = True, assume_for: tuple[str, ...] = ()) -> list[dict]:
    """Write the table at `path` from bench `reports`. With `keep`, an existing valid table at
    `path` is merged: its entries for (op, device kind) pairs these reports did not measure stay as
    they are, and for measured pairs its measurements at other sizes stay (the buckets are then
    re-split), unless they were assumed from another card. `assume_for`: GPU device kinds without
    figures of their own that take copies of the measured GPU's entries, marked "assumed_from" (a
    run on such a card replaces them). The result is checked by margrpo.ops._table before it is
    written. Returns the entries written for the measured (and assumed) pairs."""
    measured = measurements(reports)
    if not measured:
        raise ValueError("bench rows: no margrpo[<backend>] rows of a known op and 4-d shape; nothing to write")
    measured_kinds = sorted({kind for _, kind in measured})
    for kind in assume_for:
        if kind not in _table.DEVICE_KINDS:
            raise ValueError(f"assume_for: got {kind!r}, expected device kinds from {', '.join(_table.DEVICE_KINDS)}")
        if len(measured_kinds) != 1 or measured_kinds[0] == "cpu" or kind in measured_kinds or kind == "cpu":
            raise ValueError(
                f"assume_for: got {kind!r} for rows measured on {', '.join(measured_kinds)}, expected a GPU "
                "kind without figures, from the rows of one GPU kind"
            )
        for (op, _), sized in list(measured.items()):
            measured[(op, kind)] = {n: {**m, "assumed_from": measured_kinds[0]} for n, m in sized.items()}
    path = Path(path)
    kept, old_sources = [], []
    if keep and path.exists():
        old = json.loads(path.read_text())
        _table.parse(old, str(path))
        for e in old["entries"]:
            pair, elements = (e["op"], e["device"]), e.get("measured", {}).get("elements")
            if pair not in measured:
                kept.append(e)
            elif (
                isinstance(elements, int)
                and "assumed_from" not in e
                and elements not in measured[pair]
                and not any("assumed_from" in m for m in measured[pair].values())
            ):
                measured[pair][elements] = {k: v for k, v in e.items() if k not in ("op", "device", "min_elements", "max_elements")}
        old_sources = [s for s in old.get("sources", []) if s not in sources]
    new = bucketed(measured)
    table = {
        "format": _table.FORMAT,
        "about": "margrpo.ops._table: auto's backend order per op, device kind and size bucket (elements of the "
        "op's main input), fastest first as measured; written by `margrpo bench ops --write-table`",
        "sources": old_sources + sources,
        "entries": sorted(kept + new, key=lambda e: (e["op"], e["device"], e["min_elements"])),
    }
    _table.parse(table, str(path))
    path.write_text(json.dumps(table, indent=1) + "\n")
    return new


def verdicts(rows: Iterable[dict]) -> list[str]:
    """One line per (op, shape, mode) where no margrpo backend beats eager, or torch.compile."""
    groups: dict[tuple, dict[str, float]] = defaultdict(dict)
    for row in rows:
        groups[(row["op"], row.get("size") or row.get("shape"), tuple(row["dims"]), row.get("mode") or "forward")][row["impl"]] = float(
            row["speedup"]
        )
    lines = []
    for (op, label, dims, mode), impls in groups.items():
        backends = {b: s for impl, s in impls.items() if (b := _backend_of(impl))}
        if not backends:
            continue
        best = max(backends, key=backends.get)
        shape = f"{op} {label} [{'x'.join(map(str, dims))}] {mode}"
        if backends[best] <= 1.0:
            lines.append(f"{shape}: no margrpo backend beats eager (best margrpo[{best}] {backends[best]:.2f}x eager)")
        elif "compile" in impls and backends[best] <= impls["compile"]:
            lines.append(
                f"{shape}: no margrpo backend beats torch.compile (best margrpo[{best}] {backends[best]:.2f}x "
                f"eager, compile {impls['compile']:.2f}x)"
            )
    return lines
