"""Argument checks shared by the public ops. Each error names the argument, what it received and
what was expected. Only metadata is checked here (types, shapes, dtypes, devices): value checks
that need the data (NaN, std <= 0) run inside the custom ops so they cost no graph break.

Metadata checks give the same answer for every call with the same signature (shapes, dtypes,
devices, options), so the public ops remember what they derived from a signature that passed
(`remember`): a repeated eager call skips the checks, which cost as much as the
kernel on small inputs. While torch.compile traces, the checks run every time (once per compile)."""

from __future__ import annotations

import math

import torch


def float_tensor(name: str, value: object) -> torch.Tensor:
    """`value` itself, after checking that it is a floating-point tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: got {type(value).__name__}, expected a torch.Tensor")
    if not value.is_floating_point():
        raise TypeError(f"{name}: got dtype {value.dtype}, expected a floating-point dtype (float16, bfloat16, float32, float64)")
    return value


def ndim(name: str, tensor: torch.Tensor, allowed: tuple[int, ...] | None = None, at_least: int | None = None, layout: str = "") -> None:
    """Rank check: one of `allowed`, or at least `at_least`. `layout` describes the expected shape."""
    ok = (allowed is None or tensor.ndim in allowed) and (at_least is None or tensor.ndim >= at_least)
    if not ok:
        raise ValueError(f"{name}: got shape {tuple(tensor.shape)} ({tensor.ndim}-d), expected {layout}")


def same_shape(name: str, tensor: torch.Tensor, shape: torch.Size | tuple[int, ...], layout: str) -> None:
    if tensor.shape != shape:  # torch.Size is a tuple: no conversion needed
        raise ValueError(f"{name}: got shape {tuple(tensor.shape)}, expected {tuple(shape)} ({layout})")


def same_device(**tensors: torch.Tensor) -> torch.device:
    """The one device of every named tensor; an error names them all when they disagree."""
    first, *others = tensors.values()
    device = first.device
    if any(t.device != device for t in others):
        found = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"{', '.join(tensors)}: expected one device, got {found}")
    return device


def all_finite(name: str, tensor: torch.Tensor, hint: str = "") -> None:
    """No NaN or infinity in `tensor` (reads the data: for eager CPU calls, where that costs no sync)."""
    if math.isfinite(float(tensor.sum())):  # one reduction: a NaN or an infinity makes the sum one
        return  # (a sum that overflows without either is counted below and passes)
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise ValueError(f"{name}: got {bad} non-finite values of {tensor.numel()}, expected finite numbers {hint}".rstrip())


def choice(name: str, value: object, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name}: got {value!r}, expected one of {', '.join(repr(o) for o in options)}")


def number(name: str, value: object, low: float | None = None, high: float | None = None) -> float:
    """A python int/float (not bool) inside [low, high], as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}, expected a python float")
    if value != value or (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name}: got {value!r}, expected a number in {bounds}")
    return float(value)


def integer(name: str, value: object, low: int, high: int) -> int:
    """A python int (not bool) inside [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: got {type(value).__name__} {value!r}, expected a python int")
    if not low <= value <= high:
        raise ValueError(f"{name}: got {value}, expected an integer in [{low}, {high}]")
    return value


def broadcast_shape(**shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast of the named shapes under torch's rules, on the tuples (torch.broadcast_shapes
    costs tens of microseconds a call, too much for a per-layer hot path); an error names them."""
    values = list(shapes.values())
    rank = max(len(shape) for shape in values)
    out = [1] * rank
    for shape in values:
        for axis, size in enumerate(shape, rank - len(shape)):
            if size != 1:
                if out[axis] not in (1, size):
                    found = ", ".join(f"{name} {tuple(s)}" for name, s in shapes.items())
                    raise ValueError(f"{', '.join(shapes)}: got shapes {found}, expected shapes that broadcast")
                out[axis] = size
    return tuple(out)


def _python_signature(*tensors: torch.Tensor | None) -> tuple:
    if not all(t is None or isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("signature: expected tensors or None")
    return tuple(None if t is None else (t.shape, t.dtype, t.device, t.is_contiguous(), t.requires_grad) for t in tensors)


# signature(*tensors) -> an exact memo key of the tensors' (or None's) rank, sizes, dtype, device,
# contiguity and requires_grad: what the ops' checks and layout work depend on. The extension's
# version packs them into bytes in C++, several times cheaper than reading them in Python (which an
# extension without it, or none, falls back to). A non-tensor raises TypeError.
try:
    from margrpo._C import signature
except ImportError:
    signature = _python_signature

PLAN_LIMIT = 256  # signatures remembered per op; a run sees a handful (one per tensor shape it uses)


def remember(plans: dict, key: object, plan: object) -> None:
    """Keep `plan` (what an op derived from a call signature that passed its checks) for `key`; the
    memo is bounded: it starts over past PLAN_LIMIT signatures (shapes that never repeat)."""
    if key is None:
        return
    if len(plans) >= PLAN_LIMIT:
        plans.clear()
    plans[key] = plan
