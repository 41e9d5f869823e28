"""FLOPs of one GRPO step: build the trainer of a config (run directory in a temporary folder, one
thread), run `--warmup` steps, then count the FLOPs of one `Trainer.train_step()` with torch's
FlopCounterMode (matmuls and convolutions; the fused ops run through their custom ops there).

    python scripts/step_flops.py [--config configs/shapes-tiny.yaml] [--warmup 1] [key=value ...]

Prints one JSON object: the overrides, the step's GFLOP in all and per operator. Run it on the code
before and after a change that should remove work, to check that it did.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def step_flops(config: str, overrides: list[str], warmup: int = 1) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from margrpo.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer.from_files(config, ["run.threads=1", f"run.out_dir={workdir}/run", *overrides])
        for _ in range(warmup):
            trainer.train_step()
            trainer.step += 1  # as Trainer.run does after each step
        counter = FlopCounterMode(display=False)
        with counter:
            trainer.train_step()
    per_op = {str(op): n / 1e9 for op, n in counter.get_flop_counts()["Global"].items()}
    return {"config": config, "overrides": overrides, "warmup": warmup, "gflop": counter.get_total_flops() / 1e9, "gflop_per_op": per_op}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes-tiny.yaml"))
    parser.add_argument("--warmup", type=int, default=1, help="uncounted steps before the counted one")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(step_flops(args.config, args.overrides, args.warmup), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
