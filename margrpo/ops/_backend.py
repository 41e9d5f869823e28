"""Backend choice for the fused ops: torch (the eager oracle), triton, cuda, cpp.

`auto` (the default, or env MARGRPO_BACKEND) follows the measured order of the backend table
(_table.py: per op, device kind and size) and, where the table has no figures, the built-in rule:
triton, else cuda, on CUDA tensors and cpp, else torch, on CPU tensors. Triton runs on CPU tensors
only under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Callable

import torch

from . import _table

BACKENDS = ("torch", "triton", "cuda", "cpp")
CHOICES = ("auto",) + BACKENDS

_selected = os.environ.get("MARGRPO_BACKEND", "auto")
_extension = None
_extension_error: str | None = None


def extension():
    """The compiled margrpo._C module, or None when it was not built (the reason is warned once)."""
    global _extension, _extension_error
    if _extension is None and _extension_error is None:
        try:
            from margrpo import _C

            _extension = _C
        except ImportError as err:
            _extension_error = str(err)
            warnings.warn(
                f"margrpo: the C++/CUDA extension margrpo._C is not available ({err}); "
                f"available backends: {', '.join(available_backends())}",
                stacklevel=2,
            )
    return _extension


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def available_backends() -> list[str]:
    """The backends this installation can run (on some device)."""
    names = ["torch"]
    if _has_triton() and (torch.cuda.is_available() or triton_interpreted()):
        names.append("triton")
    ext = _extension if _extension is not None else (None if _extension_error else extension())
    if ext is not None:
        if getattr(ext, "with_cuda", False) and torch.cuda.is_available():
            names.append("cuda")
        names.append("cpp")
    return names


def set_backend(name: str) -> None:
    """Select the backend for every op: 'auto' or one of torch, triton, cuda, cpp."""
    global _selected
    if name not in CHOICES:
        raise ValueError(f"backend: got {name!r}, expected one of {', '.join(CHOICES)}")
    _selected = name


def get_backend() -> str:
    return _selected


@contextlib.contextmanager
def use_backend(name: str):
    """Temporarily select a backend (tests, benchmarks)."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def _runs_on(name: str, device: torch.device) -> bool:
    if name == "torch":
        return True
    if name == "triton":
        return _has_triton() and (device.type == "cuda" or (device.type == "cpu" and triton_interpreted()))
    ext = extension()
    if ext is None:
        return False
    if name == "cpp":
        return device.type == "cpu"
    return device.type == "cuda" and bool(getattr(ext, "with_cuda", False))  # cuda


# the built-in rule of `auto`, where the backend table has no figures
DEFAULT_ORDER = {"cuda": ("triton", "cuda", "torch"), "cpu": ("cpp", "torch")}


def auto_order(device: torch.device, op: str, elements: int | None = None) -> tuple[str, ...]:
    """The backends `auto` tries for `op` on `device` with a main input of `elements` elements: the
    table's measured order, then the built-in rule's other backends (torch last: it always runs)."""
    default = DEFAULT_ORDER.get(device.type, ("torch",))
    measured = _table.current().order(op, _table.device_kind(device), elements)
    if measured is None:
        return default
    return measured + tuple(name for name in default + ("torch",) if name not in measured)


def resolve(
    device: torch.device,
    op: str,
    has_kernel: Callable[[str], bool] | None = None,
    elements: int | None = None,
    selection: str | None = None,
    implemented: tuple[str, ...] = BACKENDS,
) -> str:
    """The backend that runs `op` on tensors of `device` under `selection` (None: the current one).

    `has_kernel(name)` says whether backend `name` has this op's kernel: a partial or stale build of
    the extension (or of kernels/) may lack it, and `auto` then moves on to the next backend.
    `elements`: the size of the op's main input, which picks the table's size bucket under `auto`.
    `implemented`: the backends the op has kernels for at all (the adaLN ops: torch and triton); a
    selection outside them takes `auto`'s choice among them, so a global `set_backend("cpp")` still
    runs every op.
    """
    choice = _selected if selection is None else selection
    if choice not in CHOICES:
        raise ValueError(f"backend: got {choice!r}, expected one of {', '.join(CHOICES)}")

    def usable(name: str) -> bool:
        return name in implemented and _runs_on(name, device) and (has_kernel is None or has_kernel(name))

    if choice == "auto" or choice not in implemented:
        return next(name for name in auto_order(device, op, elements) if usable(name))
    if not _runs_on(choice, device):
        raise RuntimeError(
            f"{op}: backend {choice!r} cannot run on {device.type} tensors here (available: {', '.join(available_backends())})"
        )
    if not usable(choice):
        raise RuntimeError(f"{op}: backend {choice!r} has no kernel for this op in this build")
    return choice
