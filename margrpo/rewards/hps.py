"""Human Preference Score v2 / v2.1: an OpenCLIP ViT-H-14 fine-tuned on human preferences.

Score = cosine similarity of the image and prompt embeddings (about 0.2-0.35; papers report x100).
Preprocessing (default preprocess='letterbox', as hpsv2.score and the MAR-GRPO reference do: hpsv2
builds its model with light_augmentation=True): bicubic resize of the long edge to 224 on the float
image, black padding to a centred square, CLIP mean/std. preprocess='center_crop' gives open_clip's
validation transform instead (shortest edge to 224, center crop), which crops non-square images;
square images score the same either way. Weights: HPS_v2.1_compressed.pt / HPS_v2_compressed.pt, an
open_clip state dict under 'state_dict', loaded strictly so a wrong file cannot go unnoticed.
Needs open-clip-torch (imported when the reward is built).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .base import Metadata, Reward
from .preprocess import ImageTransform
from .registry import register
from .weights import WeightsSpec, load_exact, read_state_dict, resolve

SOURCE = "https://huggingface.co/xswu/HPSv2 (files HPS_v2.1_compressed.pt, HPS_v2_compressed.pt)"
FILES = {"2.1": "HPS_v2.1_compressed.pt", "2.0": "HPS_v2_compressed.pt"}
PREPROCESS = {"letterbox": ImageTransform.clip_letterbox, "center_crop": ImageTransform.clip}


def weights_spec(version: str) -> WeightsSpec:
    return WeightsSpec(
        "hps", f"hps/{FILES[version]}", f"one file {FILES[version]}: an open_clip ViT-H-14 state dict under 'state_dict'", SOURCE
    )


def build_open_clip(architecture: str, device: str | torch.device = "cpu"):
    """An untrained open_clip CLIP for `architecture`: a built-in name (ViT-H-14) or a JSON file with
    open_clip's model config keys (embed_dim, vision_cfg, text_cfg). Returns (model, model_cfg).

    The model is built on `device` (its random init runs there: on a GPU in well under a second, where
    a CPU takes half a minute for ViT-H-14's 1 B parameters); the weights are loaded over it anyway."""
    import open_clip

    device = torch.device(device)
    with torch.device(device):
        return _create_open_clip(open_clip, architecture, device)


def _create_open_clip(open_clip, architecture: str, device: torch.device):
    if architecture.endswith(".json"):
        path = Path(architecture)
        if not path.is_file():
            raise FileNotFoundError(f"architecture: config file not found: {path}")
        cfg = json.loads(path.read_text())
        missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in cfg]
        if missing:
            raise ValueError(f"architecture: {path} lacks open_clip config keys {missing}")
        model = open_clip.create_model("ViT-H-14", pretrained=None, device=device, **cfg)
    else:
        cfg = open_clip.get_model_config(architecture)
        if cfg is None:
            raise ValueError(f"architecture: unknown open_clip model {architecture!r} (or give a .json config)")
        model = open_clip.create_model(architecture, pretrained=None, device=device)
    return model, cfg


@register("hps")
class HPSReward(Reward):
    """HPS v2.1 (default) or v2.0 score of each (image, prompt) pair.

    Args:
        path: checkpoint file; default $MARGRPO_WEIGHTS_DIR/hps/HPS_v2.1_compressed.pt (or v2 name).
        version: '2.1' or '2.0' (picks the default file name; the architecture is the same).
        architecture: open_clip model name, or a JSON model config (tests, benchmarks).
        preprocess: 'letterbox' (hpsv2.score's transform, default) or 'center_crop' (see above).
    """

    def __init__(
        self,
        path: str | None = None,
        version: str = "2.1",
        architecture: str = "ViT-H-14",
        preprocess: str = "letterbox",
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        if version not in FILES:
            raise ValueError(f"version: got {version!r}, expected one of {', '.join(FILES)}")
        if preprocess not in PREPROCESS:
            raise ValueError(f"preprocess: got {preprocess!r}, expected one of {', '.join(PREPROCESS)}")
        spec = weights_spec(version)
        checkpoint = resolve(spec, path)
        state = read_state_dict(spec, checkpoint)
        model, cfg = build_open_clip(architecture, self.device)  # every parameter is then loaded (strict)
        load_exact(spec, model, state, checkpoint)
        self.model = model.to(self.device, self.dtype).eval().requires_grad_(False)
        from open_clip.tokenizer import SimpleTokenizer

        self.tokenizer = SimpleTokenizer(context_length=cfg["text_cfg"].get("context_length", 77))
        size = cfg["vision_cfg"].get("image_size", 224)
        self.transform = PREPROCESS[preprocess](size if isinstance(size, int) else size[0])

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        pixels = self.transform(images, self.dtype)
        tokens = self.tokenizer(prompts).to(self.device)
        image_features = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
        text_features = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return (image_features * text_features).sum(-1)
