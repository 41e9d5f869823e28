"""Backbones by name, as configs refer to them (`backbone: {name: nova, checkpoint: DIR}`), and the
one function that loads a config's backbone: `margrpo train`, `sample`, `eval` and the benchmarks
all go through load_backbone.

A loader is `loader(checkpoint: Path, *, device, dtype, **options) -> MARBackbone` (in eval mode).
The built-in families are registered by import path, so importing margrpo.models does not import
transformers or diffusers; `register_backbone` adds one of your own.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from margrpo.checkpoints import resolve_checkpoint
from margrpo.config import ConfigError, ConfigFileNotFoundError

from .base import check_backbone

if TYPE_CHECKING:
    from .base import MARBackbone
    from .config import BackboneConfig

Loader = Callable[..., "MARBackbone"]
_LOADERS: dict[str, Loader | str] = {
    "tiny": "margrpo.models.tiny:load",
    "nova": "margrpo.models.nova:load",
    "harmon": "margrpo.models.harmon:load",
}


def register_backbone(name: str, loader: Loader | None = None):
    """Make `loader` loadable as `backbone.name: name`; without `loader`, a function decorator."""

    def add(fn: Loader) -> Loader:
        if name in _LOADERS and _LOADERS[name] is not fn:
            raise ValueError(f"register_backbone: name {name!r} is already taken by {_LOADERS[name]!r}")
        _LOADERS[name] = fn
        return fn

    return add if loader is None else add(loader)


def available_backbones() -> list[str]:
    """Registered backbone names, sorted."""
    return sorted(_LOADERS)


def backbone_loader(name: str) -> Loader:
    """The loader registered under `name` (a built-in one is imported on first use)."""
    if name not in _LOADERS:
        raise KeyError(f"backbone.name: got {name!r}, expected one of {', '.join(available_backbones())}")
    loader = _LOADERS[name]
    if isinstance(loader, str):
        module, attr = loader.split(":")
        loader = _LOADERS[name] = getattr(importlib.import_module(module), attr)
    return loader


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto" -> cuda when a GPU is visible, else cpu; anything else as torch.device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def check_options(name: str, loader: Loader, options: dict) -> None:
    """Raise ConfigError naming every key of `options` the loader does not take (a loader with
    **kwargs takes anything here; it raises TypeError itself, which load_backbone reports)."""
    params = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL][1:]  # not the path
    accepted = [n for n in accepted if n not in ("device", "dtype")]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"backbone.options: got unknown option(s) {', '.join(unknown)} for backbone {name!r}, "
            f"expected some of: {', '.join(accepted) or '(none)'}"
        )


def load_backbone(config: BackboneConfig, device: str | torch.device = "cpu") -> MARBackbone:
    """The backbone `config` names, from its checkpoint, on `device` ("auto" allowed), in eval mode.
    What is wrong with the config (a checkpoint that is not a model directory, an option the loader
    does not take) is a ConfigError naming the key, raised before or instead of the loading."""
    loader = backbone_loader(config.name)
    check_options(config.name, loader, config.options)
    try:
        checkpoint = resolve_checkpoint(config.checkpoint)
    except FileNotFoundError as err:  # an unknown builtin:NAME
        raise ConfigFileNotFoundError(f"backbone.{err}") from err
    if (checkpoint / "manifest.json").is_file() or (checkpoint / "checkpoints").is_dir():
        raise ConfigFileNotFoundError(
            f"backbone.checkpoint: {checkpoint} is a training run or run checkpoint (trained tensors only), not a "
            f"model directory; write the trained model out with `margrpo export {checkpoint} OUT_DIR` and use "
            "backbone.checkpoint=OUT_DIR (margrpo sample and eval take it directly as --checkpoint)"
        )
    dtype = getattr(torch, config.dtype)
    try:
        backbone = loader(checkpoint, device=resolve_device(device), dtype=dtype, **config.options)
    except FileNotFoundError as err:  # a directory without the model's files (the loader names them)
        if isinstance(err, ConfigError):
            raise
        raise ConfigFileNotFoundError(f"backbone.checkpoint: {err}") from err
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise ConfigError(f"backbone.options: {err}") from err
    return check_backbone(backbone, f"backbone.name {config.name!r}").eval()
