"""Where reward weights come from: local files only, never the network.

A reward's weights are found at the path given in its config, else under the directory named by the
environment variable MARGRPO_WEIGHTS_DIR in the reward's standard layout. A missing file raises
MissingWeightsError naming the file, the layout expected, and where the authors publish it; a file
that cannot be read or does not fit the model raises CorruptWeightsError naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS_DIR_ENV = "MARGRPO_WEIGHTS_DIR"


class MissingWeightsError(FileNotFoundError):
    """A reward's weight file or directory is not on disk."""


class CorruptWeightsError(RuntimeError):
    """A weight file exists but cannot be read, or its tensors do not fit the model."""


@dataclass(frozen=True)
class WeightsSpec:
    """What a reward expects on disk.

    reward: the reward's registry name. default: path relative to MARGRPO_WEIGHTS_DIR.
    layout: the files expected there, in words. source: where the authors publish the weights.
    option: the reward option that gives this location (named in error messages).
    """

    reward: str
    default: str
    layout: str
    source: str
    option: str = "path"

    def describe(self) -> str:
        return f"expected layout: {self.layout}; published at: {self.source}"


def resolve(spec: WeightsSpec, path: str | os.PathLike | None, kind: str = "file") -> Path:
    """The weights location for `spec`: `path` if given, else $MARGRPO_WEIGHTS_DIR/<spec.default>.

    kind is 'file' or 'dir'. Raises MissingWeightsError when nothing is there.
    """
    if path is None:
        root = os.environ.get(WEIGHTS_DIR_ENV)
        if not root:
            raise MissingWeightsError(
                f"{spec.reward}: no weights path given and {WEIGHTS_DIR_ENV} is not set; set the reward's "
                f"{spec.option} option or put the weights at ${WEIGHTS_DIR_ENV}/{spec.default} ({spec.describe()})"
            )
        path = Path(root) / spec.default
    path = Path(path).expanduser()
    wrong_kind = path.is_file() if kind == "dir" else path.is_dir()
    if wrong_kind:
        got = "a file" if kind == "dir" else "a directory"
        raise MissingWeightsError(f"{spec.reward}: option {spec.option}={path} is {got}, expected a {kind} ({spec.describe()})")
    exists = path.is_dir() if kind == "dir" else path.is_file()
    if not exists:
        raise MissingWeightsError(f"{spec.reward}: weights {kind} not found: {path} (option {spec.option}; {spec.describe()})")
    return path


def require_files(spec: WeightsSpec, directory: Path, names: Iterable[str | tuple[str, ...]]) -> None:
    """Check that `directory` holds each named file (a tuple means: any one of these names)."""
    for name in names:
        options = (name,) if isinstance(name, str) else name
        if not any((directory / n).is_file() for n in options):
            shown = " or ".join(str(directory / n) for n in options)
            raise MissingWeightsError(f"{spec.reward}: missing file {shown} (option {spec.option}; {spec.describe()})")


def read_state_dict(spec: WeightsSpec, path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file (.safetensors, or a torch pickle read with weights_only=True).

    Unwraps a {'state_dict': ...} or {'model': ...} container and a DistributedDataParallel
    'module.' prefix, the two shapes published reward checkpoints come in.
    """
    state: Any  # a dict of tensors once checked below; torch.load may return anything
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # any reader failure means the file is unusable
        raise CorruptWeightsError(
            f"{spec.reward}: cannot read weights file {path}: {type(err).__name__}: {err} ({spec.describe()})"
        ) from err
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CorruptWeightsError(f"{spec.reward}: {path} does not hold a dict of tensors ({spec.describe()})")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _listed(items: list[str]) -> str:
    return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")


def _compare_keys(module: nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str], list[str]]:
    """(missing, unexpected, shape mismatches) of `state` against `module`'s state dict."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in expected
        if k in state and state[k].shape != expected[k].shape
    ]
    return missing, unexpected, wrong


def load_exact(
    spec: WeightsSpec, module: nn.Module, state: dict[str, torch.Tensor], path: Path, ignore_prefixes: tuple[str, ...] = ()
) -> None:
    """Load `state` into `module`, requiring every parameter to be present with the right shape.

    Keys starting with one of `ignore_prefixes` (parts of the checkpoint a reward does not use)
    are dropped first; any other extra key, missing key or shape mismatch is a CorruptWeightsError.
    """
    state = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    missing, unexpected, wrong = _compare_keys(module, state)
    if missing or unexpected or wrong:
        problems = [
            f"{len(missing)} missing keys: {_listed(missing)}" if missing else "",
            f"{len(unexpected)} unexpected keys: {_listed(unexpected)}" if unexpected else "",
            f"{len(wrong)} shape mismatches: {_listed(wrong)}" if wrong else "",
        ]
        raise CorruptWeightsError(
            f"{spec.reward}: weights file {path} does not match the model: {'; '.join(p for p in problems if p)} ({spec.describe()})"
        )
    module.load_state_dict(state, strict=True)


def load_reporting(
    spec: WeightsSpec,
    module: nn.Module,
    state: dict[str, torch.Tensor],
    path: Path,
    essential_prefixes: tuple[str, ...],
    ignore_prefixes: tuple[str, ...] = (),
) -> None:
    """Load `state` non-strictly, as an official loader with strict=False does, but say what it skips.

    A missing key under one of `essential_prefixes` (the parts the score is computed from) or any
    shape mismatch is a CorruptWeightsError; other missing keys and unexpected keys are named in a
    UserWarning and left as they are (missing ones keep the module's init)."""
    state = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    missing, unexpected, wrong = _compare_keys(module, state)
    essential_missing = [k for k in missing if k.startswith(essential_prefixes)]
    if essential_missing or wrong:
        problems = [
            f"{len(essential_missing)} missing keys the score needs: {_listed(essential_missing)}" if essential_missing else "",
            f"{len(wrong)} shape mismatches: {_listed(wrong)}" if wrong else "",
        ]
        raise CorruptWeightsError(
            f"{spec.reward}: weights file {path} does not fit the model: {'; '.join(p for p in problems if p)} ({spec.describe()})"
        )
    if missing or unexpected:
        warnings.warn(
            f"{spec.reward}: weights file {path}: loaded non-strictly; "
            + "; ".join(
                p
                for p in [
                    f"{len(unexpected)} unexpected keys ignored: {', '.join(unexpected)}" if unexpected else "",
                    f"{len(missing)} missing keys left at init (not used by the score): {', '.join(missing)}" if missing else "",
                ]
                if p
            ),
            stacklevel=3,
        )
    module.load_state_dict(state, strict=False)


def load_hf_model(spec: WeightsSpec, model_cls, directory: Path):
    """A transformers model from a local directory in the Hugging Face layout (config.json plus
    model.safetensors or pytorch_model.bin, possibly sharded). Never contacts the hub; a checkpoint
    that leaves parameters uninitialised is a CorruptWeightsError instead of a silent random init.
    A directory of another model type (config.json's model_type) is refused before loading."""
    require_files(
        spec,
        directory,
        ["config.json", ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")],
    )
    expected_type = model_cls.config_class.model_type
    try:
        got_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise CorruptWeightsError(f"{spec.reward}: cannot read {directory / 'config.json'}: {err} ({spec.describe()})") from err
    if got_type != expected_type:
        raise CorruptWeightsError(
            f"{spec.reward}: option {spec.option}={directory} holds a {got_type!r} model (config.json model_type), "
            f"expected {expected_type!r} for {model_cls.__name__} ({spec.describe()})"
        )
    try:
        model, info = model_cls.from_pretrained(str(directory), local_files_only=True, output_loading_info=True)
    except Exception as err:
        raise CorruptWeightsError(
            f"{spec.reward}: cannot load {model_cls.__name__} from {directory}: {type(err).__name__}: {err} ({spec.describe()})"
        ) from err
    missing = list(info.get("missing_keys", [])) + list(info.get("mismatched_keys", []))
    if missing:
        raise CorruptWeightsError(
            f"{spec.reward}: {directory} lacks {len(missing)} weights of {model_cls.__name__}, e.g. "
            f"{', '.join(map(str, missing[:5]))} ({spec.describe()})"
        )
    return model.eval().requires_grad_(False)
