"""Model checkpoints shipped inside the margrpo package, and how configs name them.

A checkpoint path in a config is either a directory on disk or `builtin:NAME`, one of the
directories below this package (today `builtin:shapes-tiny`, the pretrained tiny ShapesWorld MAR
of the default config). The shipped files are package data, so the name resolves the same way in a
source checkout and in a wheel install, whatever the working directory. (The checkpoints a training
run writes are margrpo.train.checkpoint's business, not this module's.)
"""

from __future__ import annotations

from pathlib import Path

from margrpo.config import ConfigFileNotFoundError

BUILTIN_PREFIX = "builtin:"
BUILTIN_DIR = Path(__file__).resolve().parent


def builtin_checkpoints() -> list[str]:
    """Names of the shipped checkpoints (each a directory with a config.json)."""
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "config.json").is_file())


def is_builtin(path: str | Path) -> bool:
    """True when `path` names a shipped checkpoint (`builtin:NAME`)."""
    return str(path).startswith(BUILTIN_PREFIX)


def resolve_checkpoint(path: str | Path) -> Path:
    """The directory a config's checkpoint path names: `builtin:NAME` -> the shipped directory
    (an unknown NAME is an error listing the shipped ones); anything else -> Path(path) unchanged."""
    if not is_builtin(path):
        return Path(path)
    name = str(path)[len(BUILTIN_PREFIX) :]
    if name not in builtin_checkpoints():
        shipped = ", ".join(BUILTIN_PREFIX + n for n in builtin_checkpoints())
        raise ConfigFileNotFoundError(f"checkpoint: got {str(path)!r}, expected one of the shipped checkpoints {shipped}")
    return BUILTIN_DIR / name
