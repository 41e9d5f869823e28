"""Paired comparison of training variants over seeds, from `margrpo ablate` output directories.

    python benchmarks/compare_runs.py BASE_DIR VARIANT_DIR [VARIANT_DIR ...] --names transition matching ...
        [--steps 10 20 30 60] [--plot OUT.png] [--json OUT.json]

Each DIR holds RUNG/seedN/ run directories (metrics.jsonl, summary.json). Per variant: the held-out
gain (overall after - before) per seed at each evaluated step, its mean, sd and 95% t-interval; the
gain difference to the first (base) variant paired by seed, with its 95% t-interval; the final KL;
each category's change; and the training time per step (rollout + reward + update; only comparable
between runs that shared the machine alike). A plot shows the per-seed held-out curves.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from margrpo.train.ablate import seed_stats

OVERALL = "heldout/overall"


def load_runs(directory: Path) -> dict[int, dict]:
    """seed -> {"curve": {step: overall}, "categories": {name: (before, after)}, "kl": float, "time": float}."""
    runs = {}
    for metrics in sorted(directory.glob("*/seed*/metrics.jsonl")):
        seed = int(metrics.parent.name.removeprefix("seed"))
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        evals = [r for r in rows if r.get("kind") == "eval" and OVERALL in r]
        train = [r for r in rows if r.get("kind") == "train" and "skipped" not in r]
        if not evals or not (metrics.parent / "summary.json").exists():
            continue  # unfinished run
        first, last = evals[0], evals[-1]
        times = [sum(r.get(k, 0.0) for k in ("time/rollout", "time/reward", "time/train")) for r in train]
        runs[seed] = {
            "curve": {r["step"]: r[OVERALL] for r in evals},
            "categories": {k: (first[k], last[k]) for k in first if k.startswith("heldout/") and k != OVERALL},
            "kl": train[-1].get("kl", math.nan) if train else math.nan,
            "time": sum(times) / len(times) if times else math.nan,
        }
    return runs


def _fmt(stats: dict) -> str:
    return f"{stats['mean']:+.3f} [{stats['mean'] - stats['ci95']:+.3f}, {stats['mean'] + stats['ci95']:+.3f}]"


def compare(variants: dict[str, dict[int, dict]], steps: list[int]) -> tuple[str, dict]:
    names = list(variants)
    base = variants[names[0]]
    lines, report = [], {}
    header = ["variant", "seeds", *[f"gain @{s}" for s in steps], "final KL", "s/step"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, runs in variants.items():
        cells = [name, str(len(runs))]
        report[name] = {"seeds": sorted(runs)}
        for step in steps:
            gains = [r["curve"][step] - r["curve"][0] for r in runs.values() if step in r["curve"] and 0 in r["curve"]]
            stats = seed_stats(gains)
            report[name][f"gain@{step}"] = {**stats, "values": gains}
            cells.append(_fmt(stats) if stats["n"] else "-")
        kl = seed_stats([r["kl"] for r in runs.values()])
        cells += [
            f"{kl['mean']:.3f} (max {max(r['kl'] for r in runs.values()):.3f})",
            f"{seed_stats([r['time'] for r in runs.values()])['mean']:.2f}",
        ]
        report[name]["kl"] = kl
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Paired by seed against {names[0]} (difference of gains, 95% t-interval):",
        "",
        "| variant | " + " | ".join(f"@{s}" for s in steps) + " | per-seed differences at the last step |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for name in names[1:]:
        cells, last = [name], []
        for step in steps:
            common = [s for s in variants[name] if s in base and step in variants[name][s]["curve"] and step in base[s]["curve"]]
            diffs = [
                (variants[name][s]["curve"][step] - variants[name][s]["curve"][0]) - (base[s]["curve"][step] - base[s]["curve"][0])
                for s in common
            ]
            stats = seed_stats(diffs)
            report[name][f"paired@{step}"] = {**stats, "values": diffs, "seeds": common}
            cells.append(_fmt(stats) if stats["n"] > 1 else "-")
            last = [f"{s}: {d:+.3f}" for s, d in zip(common, diffs)]
        lines.append("| " + " | ".join(cells) + " | " + ", ".join(last) + " |")
    categories = sorted({c for runs in variants.values() for r in runs.values() for c in r["categories"]})
    lines += [
        "",
        "Held-out categories, mean over seeds (before -> after):",
        "",
        "| variant | " + " | ".join(c.removeprefix("heldout/") for c in categories) + " |",
        "|---|" + "---|" * len(categories),
    ]
    for name, runs in variants.items():
        cells = []
        for c in categories:
            before = seed_stats([r["categories"][c][0] for r in runs.values()])["mean"]
            after = seed_stats([r["categories"][c][1] for r in runs.values()])["mean"]
            cells.append(f"{before:.3f} -> {after:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines), report


def plot(variants: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, runs), colour in zip(variants.items(), colours):
        for i, run in enumerate(runs.values()):
            steps = sorted(run["curve"])
            ax.plot(
                steps,
                [run["curve"][s] - run["curve"][0] for s in steps],
                color=colour,
                alpha=0.6,
                marker="o",
                markersize=3,
                label=name if i == 0 else None,
            )
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out gain (overall)")
    ax.legend()
    ax.set_title("held-out gain per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--names", nargs="+")
    parser.add_argument("--steps", nargs="+", type=int, default=[10, 20, 30, 60])
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = args.names or [d.name for d in args.dirs]
    if len(names) != len(args.dirs):
        parser.error(f"--names: got {len(names)} names for {len(args.dirs)} directories")
    variants = {name: load_runs(d) for name, d in zip(names, args.dirs)}
    empty = [name for name, runs in variants.items() if not runs]
    if empty:
        parser.error(f"no finished runs for {', '.join(empty)}")
    table, report = compare(variants, args.steps)
    print(table)
    if args.plot:
        plot(variants, args.plot)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
