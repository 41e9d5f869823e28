"""PickScore and CLIPScore: image-prompt agreement from a CLIP model in a local directory.

PickScore (Kirstain et al.): logit_scale.exp() * cos(image, prompt), a ViT-H-14 CLIP fine-tuned on
Pick-a-Pic preferences (about 20-23 for good images). CLIPScore: scale * cos with scale 100 (the
torchmetrics convention; Hessel et al. use 2.5) on any CLIP, by default ViT-L/14.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .base import Metadata, Reward
from .hf_clip import HFClip
from .registry import register
from .weights import WeightsSpec, resolve

HF_LAYOUT = (
    "a Hugging Face model directory: config.json, model.safetensors or pytorch_model.bin, tokenizer files and preprocessor_config.json"
)
PICKSCORE = WeightsSpec(
    "pickscore",
    "pickscore",
    "a Hugging Face CLIPModel directory (config.json, model.safetensors or pytorch_model.bin) with "
    "the tokenizer files and preprocessor_config.json in it or in the processor_path directory "
    "(PickScore_v1 ships without them: use those of laion/CLIP-ViT-H-14-laion2B-s32B-b79K)",
    "https://huggingface.co/yuvalkirstain/PickScore_v1 (model) with the processor files of "
    "https://huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
)
CLIPSCORE = WeightsSpec("clipscore", "clip-vit-large-patch14", HF_LAYOUT, "https://huggingface.co/openai/clip-vit-large-patch14")


class _ClipSimilarity(Reward):
    spec: WeightsSpec

    def __init__(
        self,
        path: str | None = None,
        processor_path: str | None = None,
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        directory = resolve(self.spec, path, kind="dir")
        processor = resolve(replace(self.spec, option="processor_path"), processor_path, kind="dir") if processor_path else None
        self.clip = HFClip(self.spec, directory, processor, self.device, self.dtype)

    def cosine(self, images: torch.Tensor, prompts: list[str], cut_after_tokenizing: bool = False) -> torch.Tensor:
        text = self.clip.text_embeddings(prompts, cut_after_tokenizing=cut_after_tokenizing)
        return (self.clip.image_embeddings(images) * text).sum(-1)


@register("pickscore")
class PickScore(_ClipSimilarity):
    """PickScore: logit_scale.exp() * cos(image, prompt). path: model dir; processor_path: tokenizer
    and preprocessor dir when they are not in the model dir."""

    spec = PICKSCORE

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        return self.clip.model.logit_scale.exp().float() * self.cosine(images, prompts)


@register("clipscore")
class CLIPScore(_ClipSimilarity):
    """CLIPScore per image. Two modes:

    mode='per_image' (default): max(scale * cos(image, prompt), 0) per image, prompts truncated by
        the tokenizer to the text context (77), keeping the end token. This is Hessel et al.'s
        per-caption definition; a reward needs a score per image, and the end token is where CLIP
        reads its text embedding from.
    mode='torchmetrics': scale * cos per image, not clamped, with torchmetrics' truncation: token
        ids are cut to the context after tokenizing, so a prompt over 77 tokens loses its end
        token. torchmetrics' CLIPScore of a batch is max(mean of these scores, 0): it clamps the
        batch mean, not each image.
    """

    spec = CLIPSCORE
    MODES = ("per_image", "torchmetrics")

    def __init__(
        self,
        path: str | None = None,
        processor_path: str | None = None,
        scale: float = 100.0,
        mode: str = "per_image",
        device: str | None = None,
        dtype: torch.dtype | str = torch.float32,
        batch_size: int | None = None,
    ) -> None:
        if mode not in self.MODES:
            raise ValueError(f"mode: got {mode!r}, expected one of {', '.join(self.MODES)}")
        super().__init__(path=path, processor_path=processor_path, device=device, dtype=dtype, batch_size=batch_size)
        self.scale, self.mode = scale, mode

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        if self.mode == "torchmetrics":
            return self.scale * self.cosine(images, prompts, cut_after_tokenizing=True)
        return (self.scale * self.cosine(images, prompts)).clamp(min=0.0)
