"""Time Trainer.train_step of two checkouts of margrpo side by side, interleaved, on this machine.

    python benchmarks/compare_checkouts.py --rounds 12 --a /path/before --b /path/after \
        --a-overrides k=v ... --b-overrides k=v ... [--json out.json]

Each checkout runs in its own worker process (its own margrpo on PYTHONPATH, its own
configs/shapes-tiny.yaml with the overrides given, working directory = the checkout), one thread.
After one warm-up step each, every round runs one step of each worker, the order alternating
(a, b then b, a), so a change of machine load hits both sides of a round. Reported per phase
(rollout, train, total): the median [p20, p80] of the per-round ratios b / a. Give overrides that
make both configs the same workload: the rounds print each side's reward mean, equal while the two
policies have not drifted apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from margrpo.train.config import load_config
from margrpo.train.trainer import Trainer
trainer = Trainer(load_config(sys.argv[1], sys.argv[2:]), create_run_dir=False)
print(json.dumps({"ready": True}), flush=True)
for _ in sys.stdin:
    start = time.perf_counter()
    metrics = trainer.train_step()
    print(json.dumps({"rollout": metrics["time/rollout"], "train": metrics["time/train"],
                      "total": time.perf_counter() - start, "reward": metrics.get("reward_mean")}), flush=True)
"""
PHASES = ("rollout", "train", "total")


def start_worker(root: str, overrides: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=root)
    config = os.path.join(root, "configs", "shapes-tiny.yaml")
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, config, "run.threads=1", "run.eval_every=0", *overrides],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    line = worker.stdout.readline()
    if not line or not json.loads(line).get("ready"):
        raise RuntimeError(f"{root}: the worker did not start (see its error above)")
    return worker


def step(worker: subprocess.Popen) -> dict:
    worker.stdin.write("step\n")
    worker.stdin.flush()
    return json.loads(worker.stdout.readline())


def quantiles(values: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(values, n=10, method="inclusive")
    return cuts[1], statistics.median(values), cuts[7]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (e.g. the commit before a change)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--a-overrides", nargs="*", default=[])
    parser.add_argument("--b-overrides", nargs="*", default=[])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds: got {args.rounds}, expected >= 2")
    workers = {"a": start_worker(args.a, args.a_overrides), "b": start_worker(args.b, args.b_overrides)}
    for worker in workers.values():
        step(worker)  # warm-up
    rounds: dict[str, list[dict]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            rounds[side].append(step(workers[side]))
        print(
            f"round {r}: "
            + "  ".join(f"{side} {rounds[side][-1]['total']:.2f} s (reward {rounds[side][-1]['reward']:.4f})" for side in "ab"),
            flush=True,
        )
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()
    print(f"{'phase':<8} {'A median s':>10} {'B median s':>10}   B / A per round: median [p20, p80]")
    for phase in PHASES:
        ratios = [b[phase] / a[phase] for a, b in zip(rounds["a"], rounds["b"])]
        low, mid, high = quantiles(ratios)
        print(
            f"{phase:<8} {statistics.median(x[phase] for x in rounds['a']):>10.2f} "
            f"{statistics.median(x[phase] for x in rounds['b']):>10.2f}   {mid:.3f} [{low:.3f}, {high:.3f}]"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "rounds": rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
