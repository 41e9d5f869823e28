"""Memory of one benchmarked call, measured apart from its timing (the measurement disturbs it).

CUDA: the caching allocator's peak (torch.cuda.max_memory_allocated) during the call, above what
was allocated just before it. CPU has no allocator peak counter, so there the figure is the bytes
of the tensors the call created and kept alive: its outputs, the tensors autograd saved for the
backward pass and the gradients it wrote (storages shared with its inputs not counted). That is
the memory a training step holds on to; transient temporaries freed inside the call are missed,
so on CPU it is a lower bound of the peak.
"""

from __future__ import annotations

import torch

from margrpo.bench.timing import Timed, synchronize

CUDA_METHOD = "peak of torch.cuda.max_memory_allocated during the call, above the memory allocated before it"
CPU_METHOD = (
    "bytes of the tensors the call created and kept (outputs, tensors saved for backward, gradients); "
    "a lower bound of the peak, CPUs have no allocator peak counter"
)


def method(device: torch.device) -> str:
    """How call_mb measures on `device` (printed above the tables, stored in the JSON)."""
    return CUDA_METHOD if device.type == "cuda" else CPU_METHOD


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def call_mb(timed: Timed, device: torch.device, inputs: object = ()) -> float:
    """MB of one untimed run of `timed` (setup excluded), by `method(device)`. `inputs`: tensors
    (or containers of them) that exist before the call and are not its cost."""
    state = timed.setup() if timed.setup else None
    args = () if timed.setup is None else (state,)
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        timed.call(*args)
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    existing = {_storage(t)[0] for t in _tensors(inputs) + _tensors(state)}
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = timed.call(*args)
    created = {ptr: nbytes for ptr, nbytes in map(_storage, saved + _tensors(out)) if ptr not in existing}
    return sum(created.values()) / 2**20
