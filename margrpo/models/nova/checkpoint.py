"""Loading a NOVA checkpoint directory (official layout, parameter names unchanged) and writing one."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import layout
from .backbone import NovaBackbone
from .config import NovaConfig
from .text import load_text_encoder
from .transformer import NovaTransformer
from .vae import load_vae


def as_dtype(dtype) -> torch.dtype:
    """A torch floating dtype from a dtype or its name."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype: got {dtype!r}, expected a floating torch dtype (or its name, e.g. 'bfloat16')")
    return dtype


def load_transformer_weights(transformer: NovaTransformer, state: dict[str, torch.Tensor], source: str) -> None:
    """Load the official transformer state dict strictly; a misfit raises ValueError listing missing and
    unexpected keys and shape mismatches."""
    expected = transformer.state_dict()
    problems = []
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing:
        problems.append(f"missing keys {missing[:10]}" + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else ""))
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:10]}" + (f" (+{len(unexpected) - 10} more)" if len(unexpected) > 10 else ""))
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if wrong:
        problems.append("shape mismatches: " + "; ".join(wrong[:10]))
    if problems:
        raise ValueError(f"{source}: the weights do not fit transformer/config.json: " + " | ".join(problems))
    transformer.load_state_dict(state, strict=True)


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    training_extra_frame: bool = False,
    flow_shift: float | None = None,
) -> NovaBackbone:
    """The NOVA backbone of an official checkpoint directory (e.g. BAAI/nova-d48w1024-sd512), in eval mode.

    path: the pipeline directory (model_index.json, transformer/, vae/, text_encoder/, tokenizer/,
    scheduler/); sizes (encoders, head depth/width, scheduler) come from its configs.
    dtype: of every component (weights are cast on load). training_extra_frame: the reference
    MAR-GRPO training forward (parity preset), see NovaBackbone. flow_shift: NOVA's pipeline
    `flow_shift` for a flow-matching scheduler (its set_shift; `backbone.options.flow_shift` in a
    config), see NovaBackbone.make_sampler.
    """
    path, dtype, device = Path(path), as_dtype(dtype), torch.device(device)
    layout.check_layout(path)
    config = NovaConfig.from_json(path / "transformer" / "config.json")
    with torch.device(device):  # random init where the weights go (fast on GPU), then overwritten
        transformer = NovaTransformer(config)
    load_transformer_weights(transformer, layout.read_weights(path / "transformer", layout.TRANSFORMER_WEIGHTS), str(path / "transformer"))
    text_encoder = load_text_encoder(path / "tokenizer", path / "text_encoder", config.text_token_len, device, dtype)
    vae = load_vae(path / "vae", device, dtype)
    scheduler = json.loads((path / "scheduler" / "scheduler_config.json").read_text())
    backbone = NovaBackbone(transformer.to(dtype), text_encoder, vae, scheduler, training_extra_frame, flow_shift)
    return backbone.eval()


def save(backbone: NovaBackbone, path: str | Path, text_encoder_prefix: str = "model.") -> Path:
    """Write `backbone` in the official layout (what `load` reads back). The Phi weights are written
    under `text_encoder_prefix`, as upstream's PhiEncoderModel stores them."""
    path = Path(path)
    frozen = backbone.frozen
    layout.write_json(
        path / layout.MODEL_INDEX,
        {
            "_class_name": "NOVAPipeline",
            "scheduler": ["diffnext.schedulers.scheduling_ddpm", backbone.scheduler_config.get("_class_name", "DDPMScheduler")],
            "text_encoder": ["transformers", "PhiEncoderModel"],
            "tokenizer": ["transformers", type(frozen.text_encoder.tokenizer).__name__],
            "transformer": ["diffnext.models.transformers.transformer_nova", "NOVATransformer3DModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        },
    )
    layout.write_json(path / "transformer" / "config.json", backbone.config.to_dict())
    layout.write_weights(path / "transformer" / f"{layout.TRANSFORMER_WEIGHTS}.safetensors", backbone.transformer.state_dict())
    phi = frozen.text_encoder.model
    phi_config = phi.config.to_dict()
    phi_config["architectures"] = ["PhiEncoderModel"]
    layout.write_json(path / "text_encoder" / "config.json", phi_config)
    layout.write_weights(
        path / "text_encoder" / f"{layout.TEXT_WEIGHTS}.safetensors", {text_encoder_prefix + k: v for k, v in phi.state_dict().items()}
    )
    frozen.text_encoder.tokenizer.save_pretrained(str(path / "tokenizer"))
    frozen.vae.vae.save_pretrained(str(path / "vae"))
    layout.write_json(path / "scheduler" / "scheduler_config.json", backbone.scheduler_config)
    return path
