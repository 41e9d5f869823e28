"""Where each backend keeps the kernel-level functions of docs/CONTRACTS.md.

torch: margrpo.ops.reference.<name>; triton: margrpo.kernels.<module>.<name>; cpp and cuda:
torch.ops.margrpo.<name> (one registration serves both devices). The public ops ask `pick` for a
backend that has every kernel they need, then `get` the functions inside their custom ops.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from . import _backend, reference


@functools.cache
def find(backend: str, module: str, name: str) -> Callable | None:
    """The kernel `name` of `backend` (from kernels/<module>.py for triton), or None when not built."""
    if backend == "torch":
        return getattr(reference, name, None)
    if backend == "triton":
        qualified = f"margrpo.kernels.{module}"
        try:
            kernels = importlib.import_module(qualified)
        except ModuleNotFoundError as err:
            if err.name not in (qualified, "margrpo.kernels"):
                raise  # the kernel module exists but one of its own imports failed: show that
            return None
        return getattr(kernels, name, None)
    if backend in ("cpp", "cuda"):
        if _backend.extension() is None:
            return None
        return getattr(torch.ops.margrpo, name, None)
    raise ValueError(f"backend: got {backend!r}, expected one of {', '.join(_backend.BACKENDS)}")


def get(backend: str, module: str, name: str) -> Callable:
    """Like `find`, but a missing kernel is an error that names it."""
    kernel = find(backend, module, name)
    if kernel is None:
        where = {"torch": "margrpo.ops.reference", "triton": f"margrpo.kernels.{module}"}.get(backend, "torch.ops.margrpo")
        raise RuntimeError(f"backend {backend!r}: kernel {where}.{name} is not built in this installation")
    return kernel


@torch.compiler.assume_constant_result
def _pick(device_type: str, op: str, module: str, names: tuple[str, ...], selection: str) -> str:
    # `selection` is only a cache key for the compiler: the result changes when set_backend() does
    device = torch.device(device_type)
    return _backend.resolve(device, op, lambda backend: all(find(backend, module, n) for n in names))


def pick(device: torch.device, op: str, module: str, *names: str) -> str:
    """The backend that runs `op` on `device`: the user's choice, or under `auto` the first of the
    device's order whose kernels `names` are all built (see _backend.resolve)."""
    return _pick(device.type, op, module, names, _backend.get_backend())
