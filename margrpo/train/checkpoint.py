"""Crash-safe checkpoints of the full training state.

Layout of one checkpoint: <run>/checkpoints/step-000123/ holding
  weights.safetensors  trainable parameters (and LoRA adapters), by parameter name
  state.pt             optimizer, LR scheduler, RNG states, advantage tracker, step, extras
  manifest.json        step, sizes and sha256 of the two files above; written last
A checkpoint is written into a temporary sibling directory and renamed into place, so a crash (even
kill -9) mid-write leaves the previous checkpoints untouched; a directory whose manifest is missing
or whose checksums do not match is reported as corrupt and never loaded silently.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PREFIX = "step-"


class CorruptCheckpointError(RuntimeError):
    """A checkpoint directory that is incomplete or whose files do not match their manifest."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": _numpy_state_to_torch(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _numpy_state_to_torch(state: tuple) -> tuple:
    # numpy arrays are not allowed by torch.load(weights_only=True); a tensor of the keys is
    kind, keys, pos, has_gauss, gauss = state
    return (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: str | Path, step: int, weights: dict[str, torch.Tensor], state: dict, keep_last: int = 3) -> Path:
    """Write checkpoint `step` under root atomically; prune to the newest `keep_last`. Returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
    torch.save(state, tmp / "state.pt")
    manifest = {"step": step, "files": {}}
    for name in ("weights.safetensors", "state.pt"):
        path = tmp / name
        manifest["files"][name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    with open(tmp / "manifest.json", "w") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    if final.exists():  # re-saving the same step (e.g. on a signal right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(root, keep_last)
    return final


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(root: str | Path) -> list[Path]:
    """Completed checkpoint directories (manifest present), oldest first. Temp dirs are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def verify(path: str | Path) -> dict:
    """Check a checkpoint against its manifest; returns the manifest or raises CorruptCheckpointError."""
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise CorruptCheckpointError(f"{path}: manifest.json is missing (incomplete checkpoint)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise CorruptCheckpointError(f"{manifest_path}: unreadable ({err})") from err
    for name, meta in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpointError(f"{file}: missing")
        if file.stat().st_size != meta["bytes"]:
            raise CorruptCheckpointError(f"{file}: {file.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)")
        if _sha256(file) != meta["sha256"]:
            raise CorruptCheckpointError(f"{file}: checksum does not match the manifest (corrupt)")
    return manifest


def load(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights, state) of a verified checkpoint."""
    path = Path(path)
    verify(path)
    weights = load_file(str(path / "weights.safetensors"))
    state = torch.load(path / "state.pt", weights_only=True)
    return weights, state


def latest(root: str | Path) -> Path | None:
    """The newest checkpoint that verifies; corrupt newer ones raise (they are never skipped silently)."""
    checkpoints = list_checkpoints(root)
    if not checkpoints:
        return None
    verify(checkpoints[-1])
    return checkpoints[-1]
