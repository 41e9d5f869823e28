"""CPU time of one GRPO step under each likelihood estimator, interleaved, with the machine's load.

    python benchmarks/estimator_step_time.py [--config configs/shapes-tiny.yaml] [--rounds 6] [key=value ...]

One trainer per estimator (the config with grpo.estimator=transition / matching); each round runs one
train_step of each, in alternating order, on the same step index (the same prompts and seeds). Prints
per estimator the median [min, max] seconds of the rollout, reward and update phases and of the whole
step, and the median of the per-round ratios matching / transition.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch

PHASES = ("time/rollout", "time/reward", "time/train")


def main(argv: list[str] | None = None) -> int:
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/shapes-tiny.yaml")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    estimators = ("transition", "matching")
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for name in estimators:
            overrides = [
                *args.overrides,
                f"grpo.estimator={name}",
                f"run.out_dir={tmp}/{name}",
                "run.tensorboard=false",
                "run.resume=never",
            ]
            trainers[name] = Trainer(load_config(args.config, overrides), create_run_dir=False)
        times: dict[str, list[dict[str, float]]] = {name: [] for name in estimators}
        load_before = os.getloadavg()[0]
        for round_index in range(args.rounds + 1):  # round 0 warms up
            order = estimators if round_index % 2 == 0 else estimators[::-1]
            for name in order:
                trainer = trainers[name]
                trainer.step = round_index
                metrics = trainer.train_step()
                if round_index:
                    times[name].append({phase: metrics[phase] for phase in PHASES})
        load_after = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load_before:.2f} -> "
        f"{load_after:.2f}, {args.rounds} rounds, config {args.config} {' '.join(args.overrides)}"
    )
    print("| estimator | rollout s | reward s | update s | step s |")
    print("|---|---|---|---|---|")
    for name in estimators:
        cells = []
        for phase in (*PHASES, "step"):
            values = [sum(t.values()) if phase == "step" else t[phase] for t in times[name]]
            cells.append(f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for phase in ("time/rollout", "time/train", "step"):
        ratios = [
            (sum(m.values()) if phase == "step" else m[phase]) / (sum(t.values()) if phase == "step" else t[phase])
            for m, t in zip(times["matching"], times["transition"])
        ]
        print(
            f"matching / transition, {phase}: median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}, {max(ratios):.2f}] over {len(ratios)} paired rounds"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
