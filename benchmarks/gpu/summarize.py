"""Print the GPU run as markdown: step status, the kernel tests (failures, then pass/fail per op x
backend x dtype), then one table per benchmark JSON ({machine, rows}); for the ops, the shapes where
no margrpo backend beats eager or torch.compile; beside any table, the timed calls that contained a JIT
compile."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return str(value)


def table(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if not isinstance(rows[0][k], dict)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def _losses(name: str, rows: list[dict]) -> str:
    """For the ops: where no margrpo backend beats eager or torch.compile (margrpo.bench.table)."""
    if name != "ops":
        return ""
    try:
        from margrpo.bench.table import verdicts

        lines = verdicts(rows)
    except (ImportError, KeyError, TypeError, ValueError) as err:
        return f"\n\n(verdicts unavailable: {err})"
    return "\n\n" + ("\n".join(["where margrpo loses:"] + lines) if lines else "margrpo beats eager and compile at every shape")


def _compiles(data) -> list[str]:
    """Every `compiles_while_timed` entry (margrpo.bench.compiles) with a compile in it: a row's
    {"triton", "graphs", "kernels"}, or a group's {method: those}."""
    found = set()

    def note(label: str, counts) -> None:
        if isinstance(counts, dict) and (counts.get("triton") or counts.get("graphs")):
            kernels = " " + ", ".join(counts["kernels"]) if counts.get("kernels") else ""
            found.add(f"{label}: {counts.get('triton', 0)} Triton variant(s){kernels}, {counts.get('graphs', 0)} graph(s)")

    def walk(node) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        if not isinstance(node, dict):
            return
        seen = node.get("compiles_while_timed")
        where = " ".join(str(node[k]) for k in ("model", "what", "path") if k in node)
        if isinstance(seen, dict) and "triton" in seen:
            note(where, seen)
        elif isinstance(seen, dict):
            for method, counts in seen.items():
                note(f"{where} {method}".strip(), counts)
        for key, value in node.items():
            if key != "compiles_while_timed":
                walk(value)

    walk(data)
    return sorted(found)


def _kernel_tables(data) -> str:
    """For the profile: each path's kernel trace (top kernels, launches, how busy the GPU was)."""
    paths = data.get("paths") if isinstance(data, dict) else None
    if not isinstance(paths, dict):
        return ""
    from margrpo.bench.kernel_profile import format_summary

    parts = [
        f"{path}: {format_summary(result['kernels'])}"
        for path, result in paths.items()
        if isinstance(result, dict) and result.get("kernels")
    ]
    return "".join(f"\n\n{part}" for part in parts)


def summarize(out: Path) -> str:
    parts = [f"# GPU run: {out}"]
    status = out / "status.txt"
    if status.exists():
        parts.append("## steps\n```\n" + status.read_text().strip() + "\n```")
    failures, log = out / "kernels_failures.txt", out / "kernels.log"
    if log.exists():
        # one line per test file (run.sh: `FILE rc=N <pytest totals>`), else a single run's totals
        lines = log.read_text(errors="replace").splitlines()
        totals = [line for line in lines if re.match(r"tests/\S+\.py rc=", line)] or [
            line for line in lines if re.search(r"\d+ (passed|failed|errors?)\b.* in [\d.]+s", line)
        ][-1:]
        listed = failures.read_text(errors="replace").splitlines() if failures.exists() else []
        parts.append(
            "## kernels\n```\n"
            + "\n".join((totals or ["(no pytest summary: cut short?)"]) + listed[:60])
            + (f"\n... {len(listed) - 60} more in {failures.name}" if len(listed) > 60 else "")
            + "\n```"
        )
    kernel_table = out / "kernels_table.md"
    if kernel_table.exists():
        parts.append("## kernel tests per op x backend x dtype\n" + kernel_table.read_text().strip())
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            parts.append(f"## {path.name}: unreadable ({err})")
            continue
        rows = data.get("rows") if isinstance(data, dict) else None
        if rows:
            machine = data.get("machine", "")
            headline = {k: v for k, v in data.items() if "speedup" in k or k == "meets_target"}
            extra = f"\n\n{json.dumps(headline)}" if headline else ""
            compiled = _compiles(data)
            if compiled:  # a timing with a JIT compile inside is not steady state: say so beside it
                extra += "\n\nCOMPILED WHILE TIMED (these times include JIT compiles):\n" + "\n".join(f"- {c}" for c in compiled)
            parts.append(
                f"## {path.stem}\n{_cell(machine) if not isinstance(machine, dict) else json.dumps(machine)}"
                f"\n\n{table(rows)}{extra}{_losses(path.stem, rows)}{_kernel_tables(data)}"
            )
    return "\n\n".join(parts)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])))
