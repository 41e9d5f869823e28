"""`margrpo ablate --config FILE --seeds 0 1 2 [key=value ...]`: the paper's ablation ladder.

Each rung adds one MAR-GRPO mechanism on top of the previous one (docs/METHOD.md section 4; the
paper's numbers: section 6):
  grpo          plain GRPO, diffusion head trained end to end
  frozen_head   + frozen diffusion head
  mte           + multi-trajectory expectation on the top-k% most uncertain tokens
  full          + consistency-aware token selection (likelihood over every unknown position)
Every rung runs over the given seeds; the table reports held-out scores per category (mean over
seeds), the spread of the overall score across seeds, and the final KL.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

LADDER: dict[str, list[str]] = {
    "grpo": ["grpo.head=train", "grpo.mte=false", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "frozen_head": ["grpo.head=frozen", "grpo.mte=false", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "mte": ["grpo.head=frozen", "grpo.mte=true", "grpo.consistency=false", "rollout.likelihood_positions=revealed"],
    "full": ["grpo.head=frozen", "grpo.mte=true", "grpo.consistency=true", "rollout.likelihood_positions=unknown"],
}


def _stats(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def format_table(results: dict[str, list[dict]]) -> str:
    """results: rung -> one summary per seed ({"after": {...}, "kl": float})."""
    keys = sorted({k for runs in results.values() for r in runs for k in r["after"]})
    header = ["rung", *[k.replace("heldout/", "") for k in keys], "overall std (seeds)", "final kl"]
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for rung, runs in results.items():
        cells = [rung]
        for key in keys:
            cells.append(f"{_stats([r['after'].get(key, float('nan')) for r in runs])[0]:.3f}")
        cells.append(f"{_stats([r['after'].get('heldout/overall', float('nan')) for r in runs])[1]:.3f}")
        cells.append(f"{_stats([r.get('kl', float('nan')) for r in runs])[0]:.2e}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .metrics import read_metrics
    from .trainer import Trainer

    parser = argparse.ArgumentParser(prog="margrpo ablate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rungs", nargs="+", default=list(LADDER), choices=list(LADDER))
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {}
    for rung in args.rungs:
        for seed in args.seeds:
            out_dir = Path(args.out) / rung / f"seed{seed}"
            trainer = Trainer.from_files(args.config, [*args.overrides, *LADDER[rung], f"run.seed={seed}",
                                                       f"run.out_dir={out_dir}"])
            summary = trainer.run()
            train = [r for r in read_metrics(out_dir / "metrics.jsonl") if r["kind"] == "train" and "kl" in r]
            results.setdefault(rung, []).append({"after": summary.get("after", {}), "kl": train[-1]["kl"] if train else float("nan")})
    table = format_table(results)
    print(table)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ablation.md").write_text(table + "\n")
    (Path(args.out) / "ablation.json").write_text(json.dumps(results, indent=1))
    return 0
