"""Where each backend keeps the kernel-level functions of docs/CONTRACTS.md, and how the public ops
reach them.

torch: margrpo.ops.oracle.<name>; triton: margrpo.kernels.<module>.<name>; cpp and cuda:
torch.ops.margrpo.<name> (one registration serves both devices).

Two paths lead from a public op to its kernels. Under torch.compile, a dispatch mode (fake tensors,
torch.export, FlopCounterMode) or a torch.func transform, the op calls its torch.library custom op:
it asks `pick` for a backend that has every kernel it needs and the custom op `get`s them. In plain
eager mode (`direct_call_allowed`) the op calls the kernels from `for_eager` itself, through a
torch.autograd.Function when a gradient is needed: the custom op's dispatch would cost 25-40 us
per call, as much as the kernels take on the real shapes.
"""

from __future__ import annotations

import bisect
import functools
import importlib
from collections.abc import Callable

import torch

from . import _backend, _table, oracle


@functools.cache
def find(backend: str, module: str, name: str) -> Callable | None:
    """The kernel `name` of `backend` (from kernels/<module>.py for triton), or None when not built."""
    if backend == "torch":
        return getattr(oracle, name, None)
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
        packet = getattr(torch.ops.margrpo, name, None)
        # the packet's own entry point (`_op`, the dispatcher's callable behind torch.ops.margrpo.<name>):
        # the packet's Python __call__ in front of it costs about 0.6 us a call
        return getattr(packet, "_op", packet)
    raise ValueError(f"backend: got {backend!r}, expected one of {', '.join(_backend.BACKENDS)}")


def get(backend: str, module: str, name: str) -> Callable:
    """Like `find`, but a missing kernel is an error that names it."""
    kernel = find(backend, module, name)
    if kernel is None:
        where = {"torch": "margrpo.ops.oracle", "triton": f"margrpo.kernels.{module}"}.get(backend, "torch.ops.margrpo")
        raise RuntimeError(f"backend {backend!r}: kernel {where}.{name} is not built in this installation")
    return kernel


@torch.compiler.assume_constant_result
def _pick(
    device_type: str, op: str, module: str, names: tuple[str, ...], selection: str, elements: int | None, implemented: tuple[str, ...]
) -> str:
    # `selection` is an argument, so the compiler's cached result changes when set_backend() does
    device = torch.device(device_type)
    return _backend.resolve(device, op, lambda backend: all(find(backend, module, n) for n in names), elements, selection, implemented)


def pick(
    device: torch.device,
    op: str,
    module: str,
    *names: str,
    elements: int | None = None,
    selection: str | None = None,
    implemented: tuple[str, ...] = _backend.BACKENDS,
) -> str:
    """The backend that runs `op` on `device`: the user's choice (`selection`, else the global one), or
    under `auto` the first of the measured (else built-in) order whose kernels `names` are all built
    (see _backend.resolve). `elements`: the main input's size (unknown while torch.compile traces)."""
    # while torch.compile traces, the size counts as unknown: it may be symbolic (dynamic shapes), and
    # dynamo passes a symbolic size off as an int, which _pick's constant result cannot take
    size = None if torch.compiler.is_compiling() else elements
    return _pick(device.type, op, module, names, selection or _backend.get_backend(), size, implemented)


_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active


def direct_call_allowed() -> bool:
    """Whether a public op may call its kernels directly instead of its custom op: not while
    torch.compile traces it, nor under a dispatch mode or torch.func transform, which need the custom
    op's fake implementation and autograd registration. (torch.compile reads the first test as a
    constant True and never traces the other two. The module-level names save the attribute lookups
    on every op call.)"""
    return not (_is_compiling() or _dispatch_modes() > 0 or _functorch_active())


class _Picks:
    """The eager path's picks of one (device, op, selection): the table's size edges for the op on
    the device, and per size segment the (backend, kernels), filled on first use."""

    __slots__ = ("edges", "by_segment")

    def __init__(self, edges: tuple[int, ...]):
        self.edges = edges
        self.by_segment: list[tuple[str, tuple[Callable, ...]] | None] = [None] * (len(edges) + 1)


# (device, op, selection) -> _Picks. The selection is part of the key, so set_backend() needs no
# invalidation and use_backend() around every call stays cheap; a new backend table clears it.
_eager_picks: dict[tuple[torch.device, str, str], _Picks] = {}
_table.on_change(_eager_picks.clear)


def for_eager(
    device: torch.device,
    op: str,
    module: str,
    names: tuple[str, ...],
    empty: bool = False,
    elements: int = 0,
    selection: str | None = None,
    implemented: tuple[str, ...] = _backend.BACKENDS,
) -> tuple[str, tuple[Callable, ...]]:
    """(backend, its kernels `names`) for `op` on `device` under `selection` (else the global one),
    with a main input of `elements` elements: `pick` and `get` in one, memoised per size bucket of
    the backend table (an error, such as a backend that cannot run here, is raised each time).
    `empty`: the oracle, which returns an empty result without any kernel launch."""
    if empty:
        return "torch", tuple(get("torch", module, name) for name in names)
    selection = selection or _backend._selected  # (not get_backend(): a call costs as much as the lookup)
    key = (device, op, selection)
    picks = _eager_picks.get(key)
    if picks is None:
        measured = selection == "auto" or selection not in implemented  # see _backend.resolve
        edges = _table.current().segments(op, _table.device_kind(device))[0] if measured else ()
        picks = _eager_picks[key] = _Picks(edges)
    segment = bisect.bisect_right(picks.edges, elements) if picks.edges else 0
    picked = picks.by_segment[segment]
    if picked is None:
        backend = _backend.resolve(device, op, lambda b: all(find(b, module, n) for n in names), elements, selection, implemented)
        picked = picks.by_segment[segment] = (backend, tuple(get(backend, module, name) for name in names))
    return picked


def operand(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` as the kernels take it: contiguous, in `dtype`; `t` itself when it already is (a .to()
    call from Python costs about 1.5 us even when it has nothing to do)."""
    if t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous()
