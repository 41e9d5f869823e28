"""grpo.head: frozen inside the update itself, whatever the caller set on the head's parameters.

MAR-GRPO's default trains the AR model only; the head passes gradients through to z. A caller of
margrpo.grpo.update who did not call `policy.head.requires_grad_(False)` would otherwise get head
gradients computed (time and memory) and counted in the gradient-norm clip, which shrinks the AR
model's step (to 0.43x with a width-1024 head). `honours_frozen_head` wraps update(): with
config.head "frozen" the head's parameters take no gradient and hold no .grad during the call, and
get their requires_grad flags and gradients back afterwards.
"""

from __future__ import annotations

import functools
import inspect

import torch


def head_parameters(policy) -> list[torch.nn.Parameter]:
    """The parameters of policy.head (none when the policy has no head module)."""
    head = getattr(policy, "head", None)
    return list(head.parameters()) if isinstance(head, torch.nn.Module) else []


def honours_frozen_head(update):
    """update(policy, reference, rollout, advantages, config, optimizer, ...) with config.head respected."""

    signature = inspect.signature(update)

    @functools.wraps(update)
    def wrapped(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments  # positional or keyword, as update takes them
        if given["config"].head != "frozen":
            return update(*args, **kwargs)
        params = [p for p in head_parameters(given["policy"]) if p.requires_grad or p.grad is not None]
        saved = [(p, p.requires_grad, p.grad) for p in params]
        for p in params:
            p.requires_grad_(False)
            p.grad = None  # a stale gradient would count in the clip
        try:
            return update(*args, **kwargs)
        finally:
            for p, requires_grad, grad in saved:
                p.requires_grad_(requires_grad)
                p.grad = grad

    return wrapped
