"""Fingerprint a few fixed-seed GRPO steps, to show that a refactor changed no number.

    python scripts/step_fingerprint.py [--config configs/shapes-tiny.yaml] [--steps 3] [key=value ...]

Runs `Trainer.train_step()` `--steps` times with the config's `run.threads` (the Trainer sets it; the
preset's is 2, `run.threads=1` for one) and prints one JSON object: every step's
metrics (timings and throughput left out) written with repr-exact floats, and a SHA-256 of the policy's weights
after the last step. Run it on the code before and after a change (e.g. from a git worktree) and
compare the two outputs: equal means the steps were bit-identical on this machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch

TIMED = {"images_per_s"}  # metrics measured by the clock, not computed


def weights_digest(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/shapes-tiny.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args()
    from margrpo.train.config import load_config
    from margrpo.train.trainer import Trainer

    trainer = Trainer(load_config(args.config, args.overrides), create_run_dir=False)
    steps = []
    for _ in range(args.steps):
        metrics = trainer.train_step()
        trainer.step += 1  # as Trainer.run does: each step its own prompts, seeds and recorded steps
        steps.append({k: repr(v) for k, v in sorted(metrics.items()) if not k.startswith("time/") and k not in TIMED})
    print(json.dumps({"steps": steps, "weights_sha256": weights_digest(trainer.policy)}, indent=1))


if __name__ == "__main__":
    main()
