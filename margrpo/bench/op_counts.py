"""Counting, on any device (a CPU is enough), the operations that would stall or load a GPU's host side.

`count_ops()` records every ATen call under a TorchDispatchMode (and the few Python-level tensor
methods that never reach the dispatcher on CPU tensors, under a TorchFunctionMode), sorted into:

  syncs          the host waits for the device: a tensor read into Python (item, int(), bool(),
                 float(), tolist, numpy) or an op whose output size depends on tensor values
                 (nonzero, masked_select, boolean-mask indexing, unique, repeat_interleave without
                 output_size, equal, allclose).
  host_to_device a tensor filled from host data (torch.tensor / as_tensor of Python numbers,
                 from_numpy): on a GPU, a blocking copy when it lands on the device.
  launches       every other ATen op except views and metadata: about one kernel launch each on a
                 GPU (the torch path; a fused Triton kernel is one launch that this count cannot see).

On a CPU every tensor is a host tensor, so bookkeeping that is host-only on a GPU (the recording plan
drawn from a CPU generator) counts too: compare counts between runs that differ only in the number of
steps to see what is paid per step. Each sync and host copy keeps the innermost margrpo source line
that caused it (`sites`), so a regression names its place.
"""

from __future__ import annotations

import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.equal.default,
    aten.is_nonzero.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
    aten.allclose.default,
}
_HOST_COPY_OPS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
# Python-level reads that do not go through the dispatcher for CPU tensors
_SYNC_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy}
# ops that allocate or reinterpret memory without running a kernel
_NO_KERNEL = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.detach.default,
    aten.lift_fresh.default,
    aten.lift_fresh_copy.default,
}


# the package's own folder: a checkout or clone named "margrpo" holds tests/ and scripts/ beside it,
# which are not margrpo frames
_PACKAGE_DIR = Path(__file__).resolve().parent.parent.as_posix() + "/"


def _site() -> str:
    """The innermost margrpo frame of the current Python stack, as 'path:line' inside the package
    (or '?')."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve().as_posix()
        if path.startswith(_PACKAGE_DIR) and not path.endswith("bench/op_counts.py"):
            return f"{path[len(_PACKAGE_DIR) :]}:{frame.lineno}"
    return "?"


def _is_view(func) -> bool:
    return torch.Tag.view_copy not in func.tags and any(
        a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns
    )


def _bool_index(func, args) -> bool:
    """aten.index with a boolean mask: the output size is the mask's count (a sync on a GPU)."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ()))


@dataclass
class OpCounts:
    """What count_ops saw. syncs / host_to_device / launches: totals; ops: every ATen op by name;
    sites: 'kind op @ margrpo/path:line' -> count for each sync and host copy."""

    syncs: int = 0
    host_to_device: int = 0
    launches: int = 0
    ops: Counter = field(default_factory=Counter)
    sites: Counter = field(default_factory=Counter)

    def _sync(self, name: str) -> None:
        self.syncs += 1
        self.sites[f"sync {name} @ {_site()}"] += 1


class _Dispatch(TorchDispatchMode):
    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counts = self.counts
        counts.ops[str(func)] += 1
        if func in _SYNC_OPS or _bool_index(func, args):
            counts._sync(str(func))
        elif func in _HOST_COPY_OPS and args[0].numel():  # an empty tensor moves no bytes
            counts.host_to_device += 1
            counts.sites[f"host_to_device {func} @ {_site()}"] += 1
        elif func not in _NO_KERNEL and not _is_view(func):
            counts.launches += 1
        return func(*args, **(kwargs or {}))


class _Function(TorchFunctionMode):
    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNC_METHODS:
            self.counts._sync(f"Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


@contextmanager
def count_ops():
    """with count_ops() as counts: ... -> an OpCounts filled by the block's tensor operations."""
    counts = OpCounts()
    with _Function(counts), _Dispatch(counts):
        yield counts
