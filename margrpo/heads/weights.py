"""Loading official head weights, building a head from a checkpoint's shapes, and test re-init."""

from __future__ import annotations

import torch
from torch import nn

from .mar_head import SimpleMLPAdaLN
from .nova_head import DiffusionMLP


def strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries under `prefix` (e.g. "diffloss.net." in a MAR checkpoint, "image_decoder." in
    NOVA's transformer), with the prefix removed; all entries when prefix is ""."""
    if not prefix:
        return dict(state_dict)
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def load_head_state_dict(head: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Load an official state dict (keys as in LTH14/mar, wusize/Harmon or baaivision/NOVA) strictly.

    Raises KeyError listing missing and unexpected keys, or ValueError listing shape mismatches."""
    weights = strip_prefix(state_dict, prefix)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise KeyError(f"state_dict for {type(head).__name__} (prefix {prefix!r}): missing keys {missing}; unexpected keys {unexpected}")
    wrong = [f"{k}: got {tuple(weights[k].shape)}, expected {tuple(v.shape)}" for k, v in expected.items() if weights[k].shape != v.shape]
    if wrong:
        raise ValueError(f"state_dict for {type(head).__name__}: shape mismatches: {'; '.join(wrong)}")
    head.load_state_dict(weights, strict=True)


def head_from_state_dict(state_dict: dict[str, torch.Tensor], prefix: str = "") -> nn.Module:
    """Build the head whose architecture the checkpoint's keys and shapes describe, and load it.

    MAR/Harmon (res_blocks.*) -> SimpleMLPAdaLN; NOVA (blocks.*.norm1.proj) -> DiffusionMLP."""
    weights = strip_prefix(state_dict, prefix)
    if "input_proj.weight" in weights:
        width, in_channels = weights["input_proj.weight"].shape
        depth = len({k.split(".")[1] for k in weights if k.startswith("res_blocks.")})
        head = SimpleMLPAdaLN(
            in_channels, width, weights["final_layer.linear.weight"].shape[0], weights["cond_embed.weight"].shape[1], depth
        )
    elif "patch_embed.proj.weight" in weights:
        width, image_dim, patch, _ = weights["patch_embed.proj.weight"].shape
        depth = len({k.split(".")[1] for k in weights if k.startswith("blocks.")})
        cond_dim = weights["time_cond_embed.condition_proj.fc1.weight"].shape[1]
        head = DiffusionMLP(depth, width, cond_dim, patch, image_dim)
    else:
        raise KeyError(
            f"state_dict (prefix {prefix!r}): found neither 'input_proj.weight' (MAR/Harmon head) nor "
            f"'patch_embed.proj.weight' (NOVA head); first keys: {sorted(weights)[:5]}"
        )
    head = head.to(next(iter(weights.values())).dtype)
    load_head_state_dict(head, weights)
    return head


@torch.no_grad()
def reinit_zero_layers_(head: nn.Module, std: float = 0.02, generator: torch.Generator | None = None) -> nn.Module:
    """Re-initialise the adaLN-Zero layers (modulation and output Linears) with N(0, std^2) weights and
    biases, so random-init tests exercise every block (zeroed ones would make them identities)."""
    for layer in head.zero_init_layers():
        for p in (layer.weight, layer.bias):
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype, device=p.device) * std)
    return head
