"""`margrpo ablate --config FILE --seeds 0 1 2 3 4 [key=value ...]`: the paper's ablation ladder over seeds.

Each rung adds one MAR-GRPO mechanism on top of the previous one (docs/METHOD.md section 4; the
paper's numbers: section 6):
  grpo          plain GRPO, diffusion head trained end to end
  frozen_head   + frozen diffusion head
  mte           + multi-trajectory expectation on the top-k% most uncertain tokens
  full          + consistency-aware token selection (likelihood over every unknown position)
  preset        the config exactly as written (the main job's distribution over seeds)
and, on request (--rungs): unknown_positions (the frozen head scored at every still-unknown position,
no MTE), mte_unknown (+ MTE there, step-drawn chains) and reference_mte (the same with the reference
code's commit-time chains, rollout.seed_chains: commit).
`--positions unknown` scores every still-unknown position in every rung (the upstream code's
likelihood: the mte rung is then mte_unknown, frozen_head unknown_positions).
`--estimator matching` (the same as the override `grpo.estimator=matching`) runs the ladder under the
matching estimator (its MTE gives the uncertain tokens more draws; consistency keeps every committed
token, so its rung equals the frozen head's there).
Every (rung, seed) run writes OUT/RUNG/seedN/summary.json when it finishes; a run whose summary exists
is not run again, so an interrupted ablation resumes, and runs may be spread over several processes
(`--seeds 0` in one, `--seeds 1` in another) and summarised by a last call (`--summarize`). The
table reports, per rung, the held-out overall score before and after, the gain (after - before,
paired by seed) with its mean, standard deviation, minimum and 95% t-interval, the per-category
scores after, and the final KL; ablation.png plots the gains with their intervals.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

LADDER: dict[str, list[str]] = {
    "grpo": ["grpo.head=train", "grpo.mte=false", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "frozen_head": ["grpo.head=frozen", "grpo.mte=false", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "mte": ["grpo.head=frozen", "grpo.mte=true", "rollout.num_seeds=3", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "full": ["grpo.head=frozen", "grpo.mte=true", "rollout.num_seeds=3", "grpo.consistency=true", "rollout.likelihood_positions=unknown"],
    # not in the default ladder: the likelihood over every still-unknown position alone (what
    # mte_unknown and reference_mte add to frozen_head besides their chains); the reference code's
    # MTE as it runs (seed chains drawn under each token's commit-time z, scored at every
    # still-unknown position), and the same positions with the step-drawn (zero-mean) chains, so
    # the two differ only in where the chains come from
    "unknown_positions": [
        "grpo.head=frozen",
        "grpo.mte=false",
        "grpo.consistency=false",
        "rollout.likelihood_positions=unknown",
    ],
    "mte_unknown": [
        "grpo.head=frozen",
        "grpo.mte=true",
        "rollout.num_seeds=3",
        "grpo.consistency=false",
        "rollout.likelihood_positions=unknown",
        "rollout.seed_chains=step",
    ],
    "reference_mte": [
        "grpo.head=frozen",
        "grpo.mte=true",
        "rollout.num_seeds=3",
        "grpo.consistency=false",
        "rollout.likelihood_positions=unknown",
        "rollout.seed_chains=commit",
    ],
    "preset": [],
}
DEFAULT_RUNGS = ["grpo", "frozen_head", "mte", "full"]
OVERALL = "heldout/overall"
# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (normal beyond)
T95 = [
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
]


def seed_stats(values: list[float]) -> dict[str, float]:
    """n, mean, sd (unbiased), min, and the 95% t-interval half-width of the mean of `values`."""
    values = [float(v) for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "min": math.nan, "ci95": math.nan}
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    t = T95[n - 2] if 2 <= n <= 31 else 1.96
    return {"n": n, "mean": mean, "sd": sd, "min": min(values), "ci95": t * sd / math.sqrt(n) if n > 1 else math.nan}


def format_table(results: dict[str, list[dict]]) -> str:
    """results: rung -> one summary per seed ({"before": {...}, "after": {...}, "kl": float})."""
    categories = sorted({k for runs in results.values() for r in runs for k in r["after"] if k != OVERALL})
    header = [
        "rung",
        "seeds",
        "overall before",
        "overall after",
        "gain mean",
        "gain 95% CI",
        "gain sd",
        "gain min",
        *[k.replace("heldout/", "") for k in categories],
        "final kl",
    ]
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for rung, runs in results.items():
        gains = [r["after"].get(OVERALL, math.nan) - r.get("before", {}).get(OVERALL, math.nan) for r in runs]
        g = seed_stats(gains)
        cells = [
            rung,
            str(len(runs)),
            f"{seed_stats([r.get('before', {}).get(OVERALL, math.nan) for r in runs])['mean']:.3f}",
            f"{seed_stats([r['after'].get(OVERALL, math.nan) for r in runs])['mean']:.3f}",
            f"{g['mean']:+.3f}",
            f"[{g['mean'] - g['ci95']:+.3f}, {g['mean'] + g['ci95']:+.3f}]",
            f"{g['sd']:.3f}",
            f"{g['min']:+.3f}",
        ]
        cells += [f"{seed_stats([r['after'].get(k, math.nan) for r in runs])['mean']:.3f}" for k in categories]
        cells.append(f"{seed_stats([r.get('kl', math.nan) for r in runs])['mean']:.2e}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def plot_gains(results: dict[str, list[dict]], out_png: Path) -> Path | None:
    """Per rung: each seed's gain (dots) and the mean with its 95% interval (bar)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(results), 3.6))
    for i, (rung, runs) in enumerate(results.items()):
        gains = [r["after"].get(OVERALL, math.nan) - r.get("before", {}).get(OVERALL, math.nan) for r in runs]
        s = seed_stats(gains)
        ax.bar(i, s["mean"], color="#9ecae1", yerr=None if math.isnan(s["ci95"]) else s["ci95"], capsize=6)
        ax.scatter([i] * len(gains), gains, color="#08519c", s=14, zorder=3)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(results)), list(results))
    ax.set_ylabel("held-out overall: after - before")
    ax.set_title("gain per rung: seeds (dots), mean and 95% interval")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def run_one(config: str, overrides: list[str], rung: str, seed: int, out_dir: Path, positions: str | None = None) -> dict:
    """One (rung, seed) run, or its saved summary when it already finished; positions: the
    likelihood positions of every rung (after the rung's own setting), None for the rung's."""
    from .metrics import read_metrics
    from .trainer import Trainer

    done = out_dir / "summary.json"
    if done.is_file():
        return json.loads(done.read_text())
    ladder = [*LADDER[rung], *([f"rollout.likelihood_positions={positions}"] if positions else [])]
    trainer = Trainer.from_files(config, [*overrides, *ladder, f"run.seed={seed}", f"run.out_dir={out_dir}"])
    summary = trainer.run()
    if "after" not in summary:  # stopped by a signal: nothing to summarise yet
        raise SystemExit(f"{out_dir}: run stopped before its end; rerun the same command to resume it")
    train = [r for r in read_metrics(out_dir / "metrics.jsonl") if r.get("kind") == "train" and "kl" in r]
    record = {"before": summary.get("before", {}), "after": summary["after"], "kl": train[-1]["kl"] if train else math.nan}
    done.write_text(json.dumps(record, indent=1))
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo ablate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--rungs", nargs="+", default=DEFAULT_RUNGS, choices=list(LADDER))
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--summarize", action="store_true", help="run nothing: tabulate the finished runs found under --out")
    parser.add_argument("--estimator", choices=["transition", "matching"], help="grpo.estimator for every rung (default: the config's)")
    parser.add_argument(
        "--positions",
        choices=["unknown"],
        help="score every still-unknown position in every rung (the upstream code's likelihood), not the rung's own positions",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.estimator:
        if any(o.startswith("grpo.estimator=") for o in args.overrides):
            parser.error("give the estimator once: --estimator or the override grpo.estimator=..., not both")
        args.overrides = [*args.overrides, f"grpo.estimator={args.estimator}"]
    out = Path(args.out)
    results: dict[str, list[dict]] = {}
    for rung in args.rungs:
        for seed in args.seeds:
            run_dir = out / rung / f"seed{seed}"
            if args.summarize:
                if (run_dir / "summary.json").is_file():
                    results.setdefault(rung, []).append(json.loads((run_dir / "summary.json").read_text()))
                continue
            results.setdefault(rung, []).append(run_one(args.config, args.overrides, rung, seed, run_dir, args.positions))
    if not results:
        raise SystemExit(f"margrpo ablate: no finished runs under {out} for rungs {args.rungs} and seeds {args.seeds}")
    table = format_table(results)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.md").write_text(table + "\n")
    (out / "ablation.json").write_text(json.dumps(results, indent=1))
    png = plot_gains(results, out / "ablation.png")
    if png:
        print(f"plot: {png}")
    return 0
