"""`margrpo export RUN_CHECKPOINT OUT_DIR`: the policy a run trained, as a model directory in its
backbone family's official layout (tiny: config.json + model.safetensors as the shipped shapes-tiny;
nova: the NOVA diffusers layout; harmon: the Hugging Face layout), which `backbone.checkpoint: OUT_DIR`
loads like the released weights.

    margrpo export runs/shapes-tiny OUT_DIR                 # the run's newest checkpoint
    margrpo export runs/shapes-tiny/checkpoints/step-00000020 OUT_DIR --ema

The backbone is rebuilt from the config saved with the checkpoint (--config only when it has none;
key=value overrides on top, e.g. backbone.checkpoint=DIR when the base model moved), the checkpoint's
trained tensors (--ema: their EMA) applied, LoRA adapters merged. OUT_DIR is written atomically and
must be new or empty unless --force. Beside the model, margrpo_export.json records the source
checkpoint, its step, which weights, and the run's config (sample and eval read their settings from it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from margrpo.config import ConfigError, to_dict
from margrpo.models.directories import check_output_dir, family_of, save_backbone, write_directory

from . import checkpoint as ckpt
from . import lora as lora_utils
from .restore import EXPORT_FILE, restore_policy, run_checkpoint, trainer_config


def export(
    source: str | Path,
    out: str | Path,
    config_file: str | None = None,
    overrides: list[str] = (),
    ema: bool = False,
    force: bool = False,
    device: str = "cpu",
) -> Path:
    """Write the policy of run checkpoint (or run directory) `source` to `out`; returns `out`."""
    checkpoint = run_checkpoint(source)
    if checkpoint is None:
        raise ConfigError(
            f"RUN_CHECKPOINT {source}: not a run checkpoint (expected <run>/checkpoints/step-XXXXXXXX "
            "with manifest.json, or a run directory holding checkpoints/)"
        )
    try:
        check_output_dir(out, force)  # before the (possibly long) load
    except FileExistsError as err:
        raise ConfigError(f"OUT_DIR: {err}") from err
    config, where = trainer_config(checkpoint, config_file, list(overrides))
    policy = restore_policy(checkpoint, config, device, ema=ema, merge=False)
    merged = lora_utils.merge_adapters(policy)
    manifest = ckpt.verify(checkpoint)
    record = {
        "source": str(Path(checkpoint).resolve()),
        "step": manifest["step"],
        "weights": "ema" if ema else "trained",
        "lora_layers_merged": merged,
        "backbone": family_of(policy),
        "config_from": where,
        "config": to_dict(config),
    }

    def write(tmp: Path) -> None:
        save_backbone(policy, tmp)
        (tmp / EXPORT_FILE).write_text(json.dumps(record, indent=1) + "\n")

    return write_directory(out, write, force=True)  # checked above


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", metavar="RUN_CHECKPOINT", help="<run>/checkpoints/step-XXXXXXXX, or a run directory (its newest)")
    parser.add_argument("out", metavar="OUT_DIR", help="model directory to write (new or empty, or any with --force)")
    parser.add_argument("--config", help="the run's config, read only when the checkpoint has none saved")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights (run.ema_decay > 0) instead")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    parser.add_argument("--device", default="cpu", help="where the model is rebuilt (default cpu)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the run's config, e.g. backbone.checkpoint=DIR")
    args = parser.parse_args(argv)
    out = export(args.checkpoint, args.out, args.config, args.overrides, args.ema, args.force, args.device)
    record = json.loads((out / EXPORT_FILE).read_text())
    print(
        f"exported step {record['step']} ({record['weights']} weights, {record['lora_layers_merged']} LoRA layers "
        f"merged; config: {record['config_from']}) to {out}; load it with backbone.name={record['backbone']} "
        f"backbone.checkpoint={out}"
    )
    return 0
