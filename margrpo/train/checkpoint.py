"""Crash-safe checkpoints of the full training state.

Layout of one checkpoint: <run>/checkpoints/step-000123/ holding
  weights.safetensors  trainable parameters (and LoRA adapters), by parameter name
  state.pt             optimizer, LR scheduler, RNG states, advantage tracker, step, extras
  manifest.json        step, sizes and sha256 of the two files above; written last
A checkpoint is written into a temporary sibling directory (.tmp-step-000123-PID) and renamed into
place, so a crash (even kill -9) mid-write leaves the previous checkpoints untouched. A directory
leaves the listing by a rename first (to .trash-...), then is deleted: re-saving a step or pruning
never leaves a step-* directory half deleted. `recover` (run when a run starts) finishes what a
killed process left: a complete temporary copy whose step is missing is moved into place, every
other leftover is deleted. A checkpoint whose manifest is missing or whose checksums do not match is
reported as corrupt and never loaded; `latest` names it and falls back to the newest valid one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PREFIX = "step-"
NAME = re.compile(r"step-(\d+)")  # a checkpoint directory (anything else, e.g. step-latest, is not one)
TEMPORARY = re.compile(r"\.tmp-(step-\d+)-\d+")  # being written by a process (named by its pid)
FILES = ("weights.safetensors", "state.pt")


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
    for name in FILES:
        path = tmp / name
        manifest["files"][name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    with open(tmp / "manifest.json", "w") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    # re-saving the same step (the last periodic save, then the final one): a kill between the two
    # renames leaves the complete temporary copy, which recover() moves into place
    old = _discard(final) if final.exists() else None
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _prune(root, keep_last)
    return final


def _discard(path: Path) -> Path:
    """Rename `path` out of the listing (one atomic step); the caller deletes what it returns."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    if trash.exists():
        shutil.rmtree(trash)
    os.replace(path, trash)
    return trash


def _prune(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(_discard(old), ignore_errors=True)


def recover(root: str | Path) -> list[str]:
    """Finish what killed processes left under root: a complete temporary copy (it verifies) of a step
    with no checkpoint is moved into place; other temporary copies, discarded directories and step-*
    directories without a manifest (a delete cut short) are removed. Returns what it did, one line
    each. Call it when no other process writes to root (a run starting)."""
    root = Path(root)
    if not root.is_dir():
        return []
    done = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and NAME.fullmatch(path.name) and not (path / "manifest.json").is_file():
            shutil.rmtree(path)
            done.append(f"removed {path.name} (no manifest: an interrupted delete or write)")
    for path in sorted(root.iterdir()):
        temporary = TEMPORARY.fullmatch(path.name)
        if temporary and path.is_dir() and not (root / temporary.group(1)).exists() and _valid(path):
            os.replace(path, root / temporary.group(1))
            done.append(f"restored {temporary.group(1)} from its complete copy {path.name}")
        elif temporary or path.name.startswith(".trash-"):
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name} (left by an interrupted save)")
    return done


def _valid(path: Path) -> bool:
    try:
        verify(path)
    except CorruptCheckpointError:
        return False
    return True


def list_checkpoints(root: str | Path) -> list[Path]:
    """Completed checkpoint directories (step-<digits> with a manifest), oldest first. Temporary and
    discarded directories and other names (step-latest, step-00000004.bak) are not checkpoints."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and NAME.fullmatch(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)))


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
    _check_manifest(manifest_path, manifest)
    for name, meta in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpointError(f"{file}: missing")
        if file.stat().st_size != meta["bytes"]:
            raise CorruptCheckpointError(f"{file}: {file.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)")
        if _sha256(file) != meta["sha256"]:
            raise CorruptCheckpointError(f"{file}: checksum does not match the manifest (corrupt)")
    return manifest


def _check_manifest(path: Path, manifest) -> None:
    """The manifest's layout: {"step": int, "files": {name: {"bytes": int, "sha256": str}}} for FILES."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    ok = (
        isinstance(manifest, dict)
        and isinstance(manifest.get("step"), int)
        and isinstance(files, dict)
        and set(files) == set(FILES)
        and all(
            isinstance(meta, dict) and isinstance(meta.get("bytes"), int) and isinstance(meta.get("sha256"), str) for meta in files.values()
        )
    )
    if not ok:
        raise CorruptCheckpointError(
            f"{path}: not a checkpoint manifest (expected step and files "
            f"{', '.join(FILES)} with bytes and sha256; got {str(manifest)[:200]})"
        )


def load(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights, state) of a verified checkpoint."""
    path = Path(path)
    verify(path)
    weights = load_file(str(path / "weights.safetensors"))
    state = torch.load(path / "state.pt", weights_only=True)
    return weights, state


def latest(root: str | Path) -> Path | None:
    """The newest checkpoint that verifies. A newer one that does not is named on stderr and passed
    over (never loaded); None when there is no valid checkpoint."""
    for path in reversed(list_checkpoints(root)):
        try:
            verify(path)
        except CorruptCheckpointError as err:
            print(f"[margrpo] skipping a corrupt checkpoint: {err}", file=sys.stderr)
            continue
        return path
    return None
