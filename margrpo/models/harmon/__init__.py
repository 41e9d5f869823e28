"""Harmon (wusize/Harmon: Qwen2.5 LLM + MAR encoder/decoder + per-token diffusion head + KL-16 VAE)
as a margrpo MAR backbone.

    from margrpo.models import harmon
    model = harmon.load("checkpoints/Harmon-1_5B", device="cuda")        # official files, names unchanged
    model = harmon.build("harmon-1.5b-random", device="cuda", dtype=torch.bfloat16)   # random init
    sampler = model.make_sampler(25)

Modules: config (HarmonConfig from config.json), presets (named sizes, random init), model (the
backbone), mar / llm / vae (its parts), checkpoint (official layouts: load, save_pretrained).
"""

from .checkpoint import MissingCheckpointError, load, load_state_dict, save_pretrained
from .config import HarmonConfig, MARConfig, VAEConfig
from .model import NEGATIVE_PROMPT, Harmon
from .presets import PRESETS, build, byte_tokenizer, preset

__all__ = [
    "NEGATIVE_PROMPT",
    "PRESETS",
    "Harmon",
    "HarmonConfig",
    "MARConfig",
    "MissingCheckpointError",
    "VAEConfig",
    "build",
    "byte_tokenizer",
    "load",
    "load_state_dict",
    "preset",
    "save_pretrained",
]
