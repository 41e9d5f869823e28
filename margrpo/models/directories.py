"""Model directories of every backbone family: which family a directory holds, and writing a model in
its family's official layout (what the family's loader reads back), atomically.

    tiny    config.json (TinyMARConfig) + model.safetensors, as margrpo/checkpoints/shapes-tiny
    nova    the diffusers pipeline layout of BAAI/nova-d48w1024-sd512 (model_index.json, transformer/, ...)
    harmon  the Hugging Face layout of wusize/Harmon-1_5B (config.json with llm/mar + model.safetensors
            + tokenizer); the GitHub layout (harmon_1.5b.pth + kl16.ckpt) is recognised, not written

A directory is written into a temporary sibling and renamed into place, so a crash never leaves a
half-written model under the final name; a non-empty target is replaced only when asked (force), and
the checkpoints shipped inside the package never.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from torch import nn

from margrpo.checkpoints import BUILTIN_DIR

# what each family's directory holds, in the words of the errors
EXPECTED = {
    "tiny": "config.json (TinyMARConfig) + model.safetensors",
    "nova": "model_index.json + transformer/ vae/ text_encoder/ tokenizer/ scheduler/ (the NOVA diffusers layout)",
    "harmon": "config.json with llm and mar sections + model.safetensors + tokenizer (or harmon_1.5b.pth + kl16.ckpt)",
}


def detect_family(path: str | Path) -> str | None:
    """The backbone family whose layout `path` holds (tiny, nova, harmon), or None."""
    path = Path(path)
    if (path / "model_index.json").is_file():
        return "nova"
    config = path / "config.json"
    if config.is_file():
        try:
            keys = json.loads(config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if isinstance(keys, dict) and {"llm", "mar"} <= set(keys):
            return "harmon"
        if isinstance(keys, dict) and {"patch_size", "width", "depth"} <= set(keys):
            return "tiny"
        return None
    return "harmon" if any(path.glob("harmon*.pth")) else None


def describe_layouts() -> str:
    """Every family's layout, one clause each (for errors about a directory that fits none)."""
    return "; ".join(f"{family}: {files}" for family, files in EXPECTED.items())


def family_of(model: nn.Module) -> str:
    """The family of a built-in backbone object (by its module, so nothing heavy is imported)."""
    module = type(model).__module__
    for family in ("nova", "harmon"):
        if module.startswith(f"margrpo.models.{family}"):
            return family
    if module == "margrpo.models.tiny":
        return "tiny"
    raise TypeError(
        f"model: a {type(model).__name__} from {module} is not a built-in backbone (tiny, nova, harmon); save it with its own code"
    )


def save_backbone(model: nn.Module, path: str | Path) -> Path:
    """Write a built-in backbone into the directory `path` in its family's official layout."""
    path = Path(path)
    family = family_of(model)
    if family == "tiny":
        model.save(path)
    elif family == "nova":
        from margrpo.models import nova

        nova.save(model, path)
    else:
        from margrpo.models import harmon

        harmon.save_pretrained(model, path, layout="hf")
    return path


def check_output_dir(path: str | Path, force: bool = False) -> Path:
    """Refuse to write a model to `path` when that would replace a shipped checkpoint, a file, or (without
    force) a non-empty directory; returns `path`."""
    path = Path(path)
    target = path.resolve()
    if target == BUILTIN_DIR or BUILTIN_DIR in target.parents:
        raise FileExistsError(
            f"{path}: is inside the package's shipped checkpoints ({BUILTIN_DIR}), which are never overwritten; write to another directory"
        )
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path}: exists and is not a directory; expected a new or empty directory")
    if not force and path.is_dir() and any(path.iterdir()):
        raise FileExistsError(f"{path}: directory is not empty; pass --force to replace its contents, or choose a new directory")
    return path


def write_directory(path: str | Path, write: Callable[[Path], object], force: bool = False) -> Path:
    """Run `write(tmp)` on a fresh temporary sibling of `path`, then rename it to `path` (replacing an
    existing directory only with force; see check_output_dir). Returns `path`."""
    path = check_output_dir(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():  # moved aside first: the final name always holds a complete directory or nothing
        old = path.with_name(f".old-{path.name}-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path
