"""NOVA text-to-image (baaivision/NOVA; NOVA-0.6B @512 is BAAI/nova-d48w1024-sd512) as a MAR backbone.

    from margrpo.models import nova
    backbone = nova.load("/ckpt/nova-d48w1024-sd512", device="cuda", dtype="bfloat16")
    sampler = backbone.make_sampler()              # the head's sampler from scheduler/scheduler_config.json
    rollout = margrpo.rollout.generate(backbone, prompts, config, seeds, sampler=sampler)

    nova.presets.build("nova-0.6b-random", device="cuda")     random init at the real sizes (benchmarks)
    nova.presets.save_preset("nova-tiny", dir)                a tiny one in the official layout (tests)

Modules: config (transformer/config.json), transformer (the network, official parameter names),
text (Phi-2 text encoder), vae (AutoencoderKL decoder), backbone (the MARBackbone), layout and
checkpoint (the official directory: checks, load, save), presets.
"""

from . import presets
from .backbone import NEGATIVE_PROMPT, NovaBackbone
from .checkpoint import load, save
from .config import NovaConfig
from .layout import REPO_ID
from .presets import PRESETS, build, save_preset
from .transformer import NovaTransformer

__all__ = [
    "NEGATIVE_PROMPT",
    "NovaBackbone",
    "NovaConfig",
    "NovaTransformer",
    "PRESETS",
    "REPO_ID",
    "build",
    "load",
    "presets",
    "save",
    "save_preset",
]
