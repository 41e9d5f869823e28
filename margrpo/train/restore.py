"""The policy a run trained, back from one of its checkpoints.

A run checkpoint (<run>/checkpoints/step-XXXXXXXX, margrpo.train.checkpoint) holds only the trainable
tensors (the LoRA adapters when grpo.lora is on; `state.pt` also holds the EMA of them when
run.ema_decay is set, and the run's config). The rest of the model is the run's backbone
(backbone.checkpoint of that config), so restoring rebuilds the backbone as the trainer did, adds the
adapters when the run had them, and copies the checkpoint's tensors in. With merge=True the adapters
are folded into the base weights afterwards: a plain backbone of its family, which `margrpo export`
writes out and `sample` / `eval --checkpoint` use.

What a --checkpoint argument names (`resolve_checkpoint_arg`): a run checkpoint, a run directory (its
newest valid checkpoint), or a model directory in a family's layout (official or exported).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from margrpo.config import ConfigError, apply_overrides, from_dict, load_config_file, load_yaml
from margrpo.models import load_backbone
from margrpo.models.directories import describe_layouts, detect_family

from . import checkpoint as ckpt
from . import lora as lora_utils
from .config import TrainerConfig

EXPORT_FILE = "margrpo_export.json"  # beside an exported model: where it came from, and the run's config


def run_checkpoint(path: str | Path) -> Path | None:
    """The run checkpoint `path` names: a step-* directory (with manifest.json) itself, or the newest
    valid checkpoint of a run directory (or of its checkpoints/ folder); None when `path` is neither."""
    path = Path(path)
    if (path / "manifest.json").is_file():
        return path
    for root in (path / "checkpoints", path):
        if ckpt.list_checkpoints(root):
            latest = ckpt.latest(root)
            if latest is None:
                raise ckpt.CorruptCheckpointError(f"{root}: no checkpoint verifies against its manifest (see above)")
            return latest
    return None


def resolve_checkpoint_arg(path: str | Path, option: str = "--checkpoint") -> tuple[str, Path]:
    """("run", step dir) or (family, model dir) for what `path` names; errors say what was expected."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{option} {path}: no such file or directory")
    found = run_checkpoint(path)
    if found is not None:
        return "run", found
    family = detect_family(path)
    if family is None:
        raise ConfigError(
            f"{option} {path}: neither a run checkpoint (a step-XXXXXXXX directory with manifest.json, "
            f"weights.safetensors and state.pt, or a run directory holding checkpoints/) nor a model directory "
            f"({describe_layouts()})"
        )
    return family, path


def saved_config(path: str | Path) -> dict | None:
    """The training config saved with a run checkpoint (in its state.pt, else <run>/config.yaml) or with
    an exported model (EXPORT_FILE); None when there is none."""
    path = Path(path)
    if (path / EXPORT_FILE).is_file():
        return json.loads((path / EXPORT_FILE).read_text()).get("config")
    if (path / "state.pt").is_file():
        # mmap: only the config string is read, not the optimizer state beside it
        state = torch.load(path / "state.pt", weights_only=True, mmap=True)
        if state.get("config"):
            return yaml.safe_load(state["config"])
    run_config = path.parent.parent / "config.yaml"
    if path.parent.name == "checkpoints" and run_config.is_file():
        return load_yaml(run_config)
    return None


def trainer_config(checkpoint: Path, config_file: str | None, overrides: list[str]) -> tuple[TrainerConfig, str]:
    """The config a run checkpoint was trained with (saved_config), else the one in `config_file`;
    `overrides` on top (e.g. backbone.checkpoint=DIR when the base model moved). Also says which."""
    data = saved_config(checkpoint)
    if data is not None:
        source = f"the config saved with {checkpoint}"
        data = apply_overrides(data, overrides)
    elif config_file is not None:
        source = config_file
        data = load_config_file(config_file, overrides)
    else:
        raise ConfigError(
            f"--config: {checkpoint} has no saved config (none in its state.pt, no "
            f"{checkpoint.parent.parent / 'config.yaml'}); pass the run's config with --config FILE"
        )
    return from_dict(TrainerConfig, data), source


def restore_policy(
    checkpoint: str | Path, config: TrainerConfig, device: str | torch.device = "cpu", ema: bool = False, merge: bool = True
):
    """The backbone of `config` with run checkpoint `checkpoint`'s trained tensors (its EMA of them with
    ema=True), LoRA adapters merged into the base weights unless merge=False, in eval mode."""
    checkpoint = Path(checkpoint)
    try:
        weights, state = ckpt.load(checkpoint)
    except ckpt.CorruptCheckpointError as err:
        raise ConfigError(f"run checkpoint: {err}") from err
    if ema:
        if not state.get("ema"):
            raise ConfigError(
                f"--ema: {checkpoint} holds no EMA weights (its run had run.ema_decay: 0); export the trained weights without --ema"
            )
        weights = state["ema"]
    try:
        policy = load_backbone(config.backbone, device)
    except FileNotFoundError as err:
        raise ConfigError(f"{err} (the base model of {checkpoint}; if it moved, pass backbone.checkpoint=DIR)") from err
    lora = config.grpo.lora
    if lora.rank:  # the adapters' initial values do not matter: every adapter tensor is in the checkpoint
        lora_utils.apply_lora(policy, lora.rank, lora.alpha, lora.dropout, lora.targets)
    own = dict(policy.named_parameters())
    unknown = sorted(set(weights) - set(own))
    wrong = [
        f"{name}: checkpoint {tuple(value.shape)}, model {tuple(own[name].shape)}"
        for name, value in weights.items()
        if name in own and value.shape != own[name].shape
    ]
    if unknown or wrong:
        problems = (
            [f"parameters not in the model: {unknown[:5]}" + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else "")]
            if unknown
            else []
        ) + ([f"shape mismatches: {'; '.join(wrong[:5])}"] if wrong else [])
        raise ConfigError(
            f"{checkpoint}: its tensors do not fit the backbone and grpo.lora of the config used "
            f"({' | '.join(problems)}); use the config the run was trained with"
        )
    with torch.no_grad():
        for name, value in weights.items():
            own[name].copy_(value.to(own[name].device))
    if merge:
        lora_utils.merge_adapters(policy)
    return policy.eval()


def command_settings(config_file: str | None, checkpoint: str | None, overrides: list[str]) -> tuple[dict, Path | None]:
    """The settings mapping of `margrpo sample` / `eval`, and the run checkpoint to restore (None: the
    mapping's backbone section names the model).

    Settings come from --config when given, else from the config saved with the checkpoint (a run's, or
    an export's), else the defaults; `overrides` on top. A model directory becomes backbone.checkpoint,
    its family backbone.name (a --config naming another family is an error)."""
    data = load_config_file(config_file, overrides) if config_file else None
    if checkpoint is None:
        if data is None:
            raise ConfigError(
                "--config: required without --checkpoint (expected a YAML config, or --checkpoint "
                "naming a run, a run checkpoint or a model directory)"
            )
        return data, None
    kind, path = resolve_checkpoint_arg(checkpoint)
    if data is None:
        data = apply_overrides(saved_config(path) or {}, overrides)
    if kind == "run":
        return data, path
    backbone = data.setdefault("backbone", {})
    if config_file and backbone.get("name", "tiny") != kind:
        raise ConfigError(
            f"--checkpoint {path}: holds a {kind} model, but the config's backbone.name is "
            f"{backbone.get('name', 'tiny')!r}; pass backbone.name={kind} or a {kind} config"
        )
    backbone.update(name=kind, checkpoint=str(path))
    return data, None
