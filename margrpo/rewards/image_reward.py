"""ImageReward (Xu et al.): BLIP image-text fusion + a score MLP trained on human preferences.

The network is rebuilt from library parts with the checkpoint's key names, so ImageReward.pt
loads without the image-reward package (which pins old timm/fairscale). Like the official loader
it loads non-strictly, but it names every key it skips in a warning, and refuses a file that lacks
a tensor of the image encoder, the text encoder or the score head:
  blip.visual_encoder  BLIP's ViT (timm VisionTransformer keys; ViT-L/16 at 224 px)
  blip.text_encoder    BERT with cross-attention to the image tokens (transformers BlipTextModel,
                       whose layers carry the same names as BLIP's med.py)
  blip.vision_proj / blip.text_proj  (in the checkpoint; unused for scoring)
  mlp.layers.*         the score head (margrpo.rewards.mlp_head)
Score = (mlp(text encoder [CLS] output) - 0.16717) / 1.03334, the constants of the release.
Prompt tokens: bert-base-uncased, padded/truncated to 35. Image: CLIP transform at 224.
The ViT size is read from the checkpoint (width, depth, patch, image size; 64-dim heads);
the text encoder from med_config.json. Needs timm and transformers.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

import torch
from torch import nn

from .base import Metadata, Reward
from .mlp_head import ScoreMLP
from .preprocess import ImageTransform
from .registry import register
from .weights import CorruptWeightsError, WeightsSpec, load_reporting, read_state_dict, require_files, resolve

SPEC = WeightsSpec(
    "image_reward",
    "image_reward",
    "a directory with ImageReward.pt, med_config.json and bert-base-uncased/ (vocab.txt and tokenizer config)",
    "https://huggingface.co/THUDM/ImageReward (ImageReward.pt, med_config.json) and "
    "https://huggingface.co/google-bert/bert-base-uncased (tokenizer)",
)
SCORE_MEAN, SCORE_STD = 0.16717362830052426, 1.0333394966054072
MAX_PROMPT_TOKENS = 35
HEAD_DIM = 64  # BLIP's ViTs use 64-dim attention heads (ViT-B: 12 x 64, ViT-L: 16 x 64)
_IGNORED = ("blip.text_encoder.embeddings.position_ids",)  # a buffer in med.py, recomputed here
ESSENTIAL = ("blip.visual_encoder.", "blip.text_encoder.", "mlp.")  # what the score is computed from


def vit_shape(state: dict[str, torch.Tensor], prefix: str = "blip.visual_encoder.") -> dict[str, int]:
    """ViT hyper-parameters read from the checkpoint's tensors."""
    try:
        width = state[f"{prefix}cls_token"].shape[-1]
        patch = state[f"{prefix}patch_embed.proj.weight"].shape[-1]
        tokens = state[f"{prefix}pos_embed"].shape[1] - 1
    except KeyError as err:
        raise CorruptWeightsError(f"image_reward: checkpoint lacks {err.args[0]} ({SPEC.describe()})") from err
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(prefix)}blocks\.(\d+)\.", k)))
    side = int(round(tokens**0.5))
    return {"embed_dim": width, "depth": depth, "patch_size": patch, "img_size": side * patch, "num_heads": max(width // HEAD_DIM, 1)}


class ImageRewardNet(nn.Module):
    """The ImageReward network with the release's parameter names."""

    def __init__(self, vit: dict[str, int], med_config: dict) -> None:
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer
        from transformers import BlipTextConfig
        from transformers.models.blip.modeling_blip_text import BlipTextModel

        self.blip: Any = nn.Module()  # a bare container, for the release's names; its children are set below
        self.blip.visual_encoder = VisionTransformer(
            **vit, mlp_ratio=4.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6), num_classes=0, global_pool=""
        )
        text_config = BlipTextConfig(
            vocab_size=med_config["vocab_size"],
            hidden_size=med_config["hidden_size"],
            intermediate_size=med_config["intermediate_size"],
            num_hidden_layers=med_config["num_hidden_layers"],
            num_attention_heads=med_config["num_attention_heads"],
            max_position_embeddings=med_config["max_position_embeddings"],
            layer_norm_eps=med_config.get("layer_norm_eps", 1e-12),
            hidden_act=med_config.get("hidden_act", "gelu"),
            encoder_hidden_size=vit["embed_dim"],
            pad_token_id=med_config.get("pad_token_id", 0),
            bos_token_id=None,
            sep_token_id=None,  # generation-only ids; scoring never generates
            is_decoder=True,  # builds the cross-attention layers; forward runs bidirectionally
        )
        self.blip.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        embed = med_config.get("embed_dim", 256)
        self.blip.vision_proj = nn.Linear(vit["embed_dim"], embed)
        self.blip.text_proj = nn.Linear(med_config["hidden_size"], embed)
        self.mlp = ScoreMLP(med_config["hidden_size"])

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, S, S] normalised; tokens [B, L] -> normalised ImageReward scores [B]."""
        image_embeds = self.blip.visual_encoder.forward_features(pixels)
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=pixels.device)
        text = self.blip.text_encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_embeds,
            encoder_attention_mask=image_mask,
            is_decoder=False,
        )
        features = text.last_hidden_state[:, 0, :].float()
        return (self.mlp(features) - SCORE_MEAN) / SCORE_STD


@register("image_reward")
class ImageReward(Reward):
    """ImageReward score per (image, prompt). path: the directory described in SPEC."""

    def __init__(
        self, path: str | None = None, device: str | None = None, dtype: torch.dtype | str = torch.float32, batch_size: int | None = None
    ) -> None:
        super().__init__(device=device, dtype=dtype, batch_size=batch_size)
        directory = resolve(SPEC, path, kind="dir")
        require_files(SPEC, directory, ["ImageReward.pt", "med_config.json", "bert-base-uncased/vocab.txt"])
        state = read_state_dict(SPEC, directory / "ImageReward.pt")
        med_config = json.loads((directory / "med_config.json").read_text())
        net = ImageRewardNet(vit_shape(state), med_config)
        load_reporting(SPEC, net, state, directory / "ImageReward.pt", ESSENTIAL, ignore_prefixes=_IGNORED)
        self.net = net.to(self.device, self.dtype).eval().requires_grad_(False)
        self.net.mlp.float()  # the head is tiny and was evaluated in fp32 by the release
        from transformers import BertTokenizer

        # BLIP adds [DEC] and [ENC]; they never occur in prompts but keep ids aligned with vocab_size 30524
        self.tokenizer = BertTokenizer.from_pretrained(str(directory / "bert-base-uncased"), local_files_only=True)
        self.tokenizer.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
        self.transform = ImageTransform.clip(vit_shape(state)["img_size"])

    def score(self, images: torch.Tensor, prompts: list[str], metadata: Metadata) -> torch.Tensor:
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_PROMPT_TOKENS, return_tensors="pt").to(
            self.device
        )
        return self.net(self.transform(images, self.dtype), tokens["input_ids"], tokens["attention_mask"])
