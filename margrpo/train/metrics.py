"""Metrics sinks of a run: JSONL (always), TensorBoard and wandb (when installed and asked for),
and the reward-curve PNG."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path


class MetricsLogger:
    """Appends one JSON object per record to <out>/metrics.jsonl and mirrors scalars to TensorBoard.

    start_step: the first step this process logs (0 for a new run, the checkpoint's step + 1 for a
    resumed one). Records of that step and later, left by an earlier process that got further than
    its last checkpoint, are dropped from the JSONL (and purged from TensorBoard), and so are torn
    lines (a kill mid-write), so the log continues exactly from the checkpoint."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = True, wandb: bool = False, config: dict | None = None, start_step: int = 0):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        truncate_metrics(self.path, start_step)
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=start_step)
            except ImportError:  # tensorboard not installed: JSONL only
                self._tb = None
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise RuntimeError("run.wandb: true, but the wandb package is not installed (pip install wandb)") from err
            self._wandb = wandb_module.init(project="margrpo", dir=str(self.out_dir), config=config or {})

    def log(self, kind: str, step: int, values: dict[str, float]) -> None:
        record = {"kind": kind, "step": step, **{k: _plain(v) for k, v in values.items()}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(f"{kind}/{key}", value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"{kind}/{k}": v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def _parse(lines: list[str]) -> tuple[list[dict], int]:
    """(the records of JSONL lines, how many non-empty lines were not records: torn by a kill)."""
    records, torn = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            torn += 1
    return records, torn


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl; lines that are not records (torn by a kill) are passed over."""
    path = Path(path)
    if not path.is_file():
        return []
    return _parse(path.read_text().splitlines())[0]


def truncate_metrics(path: str | Path, start_step: int) -> None:
    """Rewrite a metrics.jsonl (atomically) keeping only its whole records of steps before start_step."""
    path = Path(path)
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    records, torn = _parse(lines)
    kept = [r for r in records if r["step"] < start_step]
    if len(kept) == len(lines):
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    print(
        f"[margrpo] {path}: continuing from step {start_step}: dropped {len(records) - len(kept)} later record(s) and {torn} torn line(s)",
        file=sys.stderr,
    )


def plot_curves(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """Training reward (mean +- std) and held-out evaluation per category against the step."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    records = read_metrics(metrics_path)
    train = [r for r in records if r["kind"] == "train" and isinstance(r.get("reward_mean"), (int, float))]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        steps = [r["step"] for r in train]
        mean = [r["reward_mean"] for r in train]
        std = [r.get("reward_std", 0.0) for r in train]
        axes[0].plot(steps, mean, label="train reward (mean)")
        axes[0].fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
        axes[0].set_xlabel("step")
        axes[0].set_ylabel("reward")
        axes[0].legend()
        axes[0].set_title("training reward")
    if evals:
        keys = sorted({k[len("heldout/") :] for r in evals for k in r if k.startswith("heldout/")})
        for key in keys:
            points = [(r["step"], r[f"heldout/{key}"]) for r in evals if isinstance(r.get(f"heldout/{key}"), (int, float))]
            if points:
                axes[1].plot(*zip(*points), marker="o", label=key)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("held-out verifier score")
        axes[1].legend()
        axes[1].set_title("held-out evaluation (fixed seeds)")
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
