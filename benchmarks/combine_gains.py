"""Pool the outputs of several `margrpo diagnose --gains` runs over different rollouts.

    python benchmarks/combine_gains.py RUN_A.txt RUN_B.txt [...] [--plot OUT.png]

Each file is the printed report of one run (e.g. steps 0-23, then `--gains-from 24`), whose last
line lists every variant's per-rollout gains. The variants present in every file are pooled in the
order of the first file (the first one is the base of the comparisons), and the report of
margrpo.train.diagnostics.gains_table is printed for the pooled rollouts: the mean gain with its
95% t-interval, the paired difference to the base and the ratio of mean gains (jackknife interval).
The runs must share the step size and the direction (checked against each file's header).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from margrpo.train.diagnostics import DirectionGains, gains_table

HEADER = re.compile(r"reward gain of one step \(eta (\S+), (\w+) direction\)")


def parse_report(text: str) -> tuple[float, str, dict[str, list[float]]]:
    """(eta, direction, {variant: per-rollout gains}) of one printed --gains report."""
    header = HEADER.search(text)
    rows = [line for line in text.splitlines() if line.strip().startswith("per rollout: ")]
    if header is None or len(rows) != 1:
        raise ValueError("not a `margrpo diagnose --gains` report: expected its header and one 'per rollout:' line")
    gains = {}
    for part in rows[0].strip().removeprefix("per rollout: ").split("; "):
        name, _, values = part.rpartition(": ")
        gains[name] = [float(v) for v in values.split()]
    return float(header.group(1)), header.group(2), gains


def pool(reports: list[tuple[float, str, dict[str, list[float]]]]) -> list[DirectionGains]:
    """The variants of every report, their gains concatenated in report order."""
    eta, direction, first = reports[0]
    for other_eta, other_direction, _ in reports[1:]:
        if (other_eta, other_direction) != (eta, direction):
            raise ValueError(f"reports differ: eta {eta:g} {direction} vs eta {other_eta:g} {other_direction}")
    shared = [name for name in first if all(name in gains for _, _, gains in reports)]
    if len(shared) < 1:
        raise ValueError("no variant is in every report")
    return [DirectionGains(name, eta, direction, [g for _, _, gains in reports for g in gains[name]]) for name in shared]


def plot(results: list[DirectionGains], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(results)))
    for row, result in enumerate(results):
        mean, low, high = result.mean_interval()
        ax.scatter(result.gains, [row] * len(result.gains), s=8, alpha=0.35, color="grey")
        ax.errorbar([mean], [row], xerr=[[mean - low], [high - mean]], fmt="o", color="black", capsize=3)
    ax.axvline(0.0, color="red", linewidth=0.8)
    ax.set_yticks(range(len(results)), [r.variant for r in results])
    ax.invert_yaxis()
    first = results[0]
    ax.set_xlabel(f"reward gain of one step (eta {first.eta:g}, {first.direction}); mean and 95% interval over {len(first.gains)} rollouts")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--plot", type=Path, help="write a per-variant plot of the pooled gains here")
    args = parser.parse_args(argv)
    results = pool([parse_report(path.read_text()) for path in args.reports])
    print(gains_table(results))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
