"""LAION aesthetic predictor v2: a linear MLP head on the L2-normalised CLIP ViT-L/14 image embedding.

Scores are on a 1-10 scale (about 5-7 for generated images); the prompt is not used.
Weights: the head sac+logos+ava1-l14-linearMSE.pth and a CLIP ViT-L/14 directory (Hugging Face
layout; the same network as OpenAI's ViT-L/14 that the head was trained on).
"""

from __future__ import annotations

import torch

from .base import Metadata, Reward
from .hf_clip import HFClip
from .mlp_head import ScoreMLP
from .registry import register
from .weights import CorruptWeightsError, WeightsSpec, load_exact, read_state_dict, resolve

HEAD = WeightsSpec(
    "aesthetic",
    "aesthetic/sac+logos+ava1-l14-linearMSE.pth",
    "one file sac+logos+ava1-l14-linearMSE.pth (state dict layers.{0,2,4,6,7}.weight/bias)",
    "https://github.com/christophschuhmann/improved-aesthetic-predictor",
)
CLIP = WeightsSpec(
    "aesthetic",
    "aesthetic/clip-vit-large-patch14",
    "a Hugging Face CLIP directory: config.json, model.safetensors, tokenizer files, preprocessor_config.json",
    "https://huggingface.co/openai/clip-vit-large-patch14",
    option="clip_path",
)


@register("aesthetic")
class AestheticReward(Reward):
    """LAION aesthetic score. path: the head file; clip_path: the CLIP ViT-L/14 directory."""

    def __init__(
        self,
        path: str | None = None,
        clip_path: str | None = None,
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        head_file = resolve(HEAD, path)
        state = read_state_dict(HEAD, head_file)
        if "layers.0.weight" not in state:
            raise CorruptWeightsError(f"aesthetic: {head_file} has no 'layers.0.weight' (keys: {sorted(state)[:5]}); {HEAD.describe()}")
        self.head = ScoreMLP(ScoreMLP.input_size_of(state))
        load_exact(HEAD, self.head, state, head_file)
        self.head = self.head.to(self.device, torch.float32).eval().requires_grad_(False)
        self.clip = HFClip(CLIP, resolve(CLIP, clip_path, kind="dir"), None, self.device, self.dtype)

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        return self.head(self.clip.image_embeddings(images))
