"""LoRA adapters (peft) as a MAR backbone's only trainable parameters, and the KL reference they
give for free: the same model with its adapters switched off computes exactly the base model, so
the trainer keeps no second copy of the weights.

The adapters are injected in place (peft.inject_adapter_in_model): an adapted layer keeps its base
weight under `<layer>.base_layer.weight` and gains `<layer>.lora_A.default.weight` and
`<layer>.lora_B.default.weight`. B starts at zero, so the adapted model starts equal to the base.
merge_adapters folds trained adapters into the base weights (`margrpo export`), giving the base
model's own layout back.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch import nn

from margrpo.config import ConfigError


def _tuner_layers(model: nn.Module) -> list[nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def has_adapters(model: nn.Module) -> bool:
    """Whether `model` carries peft adapter layers."""
    try:
        return bool(_tuner_layers(model))
    except ImportError:  # without peft there are no peft adapters
        return False


def target_modules(model: nn.Module, patterns: list[str]) -> list[str]:
    """Names of the nn.Linear layers to adapt, never inside the diffusion head (`model.head`).

    patterns: regular expressions matched against the full module name; empty: every nn.Linear whose
    weight is among the backbone's trainable_parameters() (what GRPO trains without LoRA)."""
    head = {id(m) for m in model.head.modules()}
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in head]
    if not patterns:
        trainable = {id(p) for p in model.trainable_parameters()}
        chosen = [name for name, m in linears if id(m.weight) in trainable]
        if not chosen:
            raise ConfigError(
                "grpo.lora.targets: the backbone's trainable parameters hold no nn.Linear weight "
                "outside the head; name the layers to adapt with grpo.lora.targets"
            )
        return chosen
    for pattern in patterns:
        if not any(re.fullmatch(pattern, name) for name, _ in linears):
            listed = ", ".join(name for name, _ in linears[:12])
            raise ConfigError(
                f"grpo.lora.targets: {pattern!r} matches no nn.Linear outside the head; "
                f"expected a regular expression over module names such as {listed}"
            )
    return [name for name, _ in linears if any(re.fullmatch(p, name) for p in patterns)]


def apply_lora(
    model: nn.Module, rank: int, alpha: float | None = None, dropout: float = 0.0, targets: list[str] = ()
) -> list[nn.Parameter]:
    """Inject LoRA adapters of `rank` (scale alpha / rank, alpha default 2 * rank) into the layers
    chosen by target_modules(model, targets), in place; returns the adapter parameters."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as err:
        raise ImportError("grpo.lora.rank > 0 needs the peft package (pip install peft)") from err
    if rank < 1:
        raise ValueError(f"rank: got {rank}, expected >= 1")
    if has_adapters(model):
        raise ValueError(
            "model: already carries peft adapters (e.g. harmon trainable: mar+lora, which also trains "
            "the MAR); grpo.lora needs a backbone without adapters"
        )
    names = target_modules(model, list(targets))
    # an exact full-name match: a name list would also match longer names ending in ".<name>"
    pattern = "|".join(re.escape(name) for name in names)
    config = LoraConfig(r=rank, lora_alpha=2 * rank if alpha is None else alpha, lora_dropout=dropout, target_modules=f"^(?:{pattern})$")
    inject_adapter_in_model(config, model)
    return adapter_parameters(model)


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every peft adapter in `model` (not the base layers they wrap)."""
    params = []
    for layer in _tuner_layers(model):
        for attribute in layer.adapter_layer_names:
            params.extend(getattr(layer, attribute).parameters())
    return params


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run `model` as its base model: every peft adapter is bypassed inside the block (the equivalent
    of PeftModel.disable_adapter() for adapters injected in place). requires_grad flags, which peft
    changes when it toggles adapters, are restored exactly on exit."""
    layers = _tuner_layers(model)
    if not layers:
        raise ValueError("model: has no peft adapters to disable")
    flags = [(p, p.requires_grad) for p in adapter_parameters(model)]
    enabled = [layer for layer in layers if not layer.disable_adapters]
    for layer in enabled:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in enabled:
            layer.enable_adapters(True)
        for param, flag in flags:
            param.requires_grad_(flag)


@torch.no_grad()
def merge_adapters(model: nn.Module) -> int:
    """Fold every peft adapter of `model` into its base layer (W + scale * B A) and put the base layer
    back in the adapter's place, so the parameter names are the base model's again. Returns how many
    layers were merged (0 for a model without adapters)."""
    if not has_adapters(model):
        return 0
    from peft.tuners.tuners_utils import BaseTunerLayer

    merged = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        if module.active_adapters and not module.disable_adapters:  # a disabled adapter adds nothing
            module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, module.get_base_layer())
        merged += 1
    for module in model.modules():  # injection's record of the adapters, which are gone now
        if "peft_config" in vars(module):
            del module.peft_config
    return merged
