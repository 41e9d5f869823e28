"""Print the GPU run as markdown: step status, then one table per benchmark JSON ({machine, rows})."""
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


def summarize(out: Path) -> str:
    parts = [f"# GPU run: {out}"]
    status = out / "status.txt"
    if status.exists():
        parts.append("## steps\n```\n" + status.read_text().strip() + "\n```")
    failures, log = out / "kernels_failures.txt", out / "kernels.log"
    if log.exists():
        totals = [line for line in log.read_text(errors="replace").splitlines()
                  if re.search(r"\d+ (passed|failed|errors?)\b.* in [\d.]+s", line)]
        listed = failures.read_text(errors="replace").splitlines() if failures.exists() else []
        parts.append("## kernels\n```\n" + "\n".join((totals[-1:] or ["(no pytest summary: cut short?)"]) + listed[:60])
                     + (f"\n... {len(listed) - 60} more in {failures.name}" if len(listed) > 60 else "") + "\n```")
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
            parts.append(f"## {path.stem}\n{_cell(machine) if not isinstance(machine, dict) else json.dumps(machine)}"
                         f"\n\n{table(rows)}{extra}")
    return "\n\n".join(parts)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1])))
