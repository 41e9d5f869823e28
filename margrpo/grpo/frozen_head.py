"""grpo.head: frozen inside the update itself, whatever the caller set on the head's parameters.

MAR-GRPO's default trains the AR model only; the head passes gradients through to z. A caller of
margrpo.grpo.update who did not call `policy.head.requires_grad_(False)` would otherwise get head
gradients computed (time and memory) and counted in the gradient-norm clip, which shrinks the AR
model's step (to 0.43x with a width-1024 head). update() runs inside `head_frozen`: with config.head
"frozen" the head's parameters take no gradient and hold no .grad during the update, and get their
requires_grad flags and gradients back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def head_frozen(policy, config) -> Iterator[None]:
    """With config.head "frozen", policy.head's parameters (if it has a head module) are frozen and
    hold no gradient inside the block; otherwise nothing changes."""
    head = getattr(policy, "head", None)
    params = list(head.parameters()) if config.head == "frozen" and isinstance(head, torch.nn.Module) else []
    saved = [(p, p.requires_grad, p.grad) for p in params if p.requires_grad or p.grad is not None]
    for p, _, _ in saved:
        p.requires_grad_(False)
        p.grad = None  # a stale gradient would count in the clip
    try:
        yield
    finally:
        for p, requires_grad, grad in saved:
            p.requires_grad_(requires_grad)
            p.grad = grad
