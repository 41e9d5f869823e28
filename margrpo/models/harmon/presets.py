"""Named Harmon architectures, and random-init models for tests and benchmarks.

    harmon-1.5b          Qwen2.5-1.5B-Instruct + MAR-H (20 + 20 blocks, 1280 wide) + head 12x1536, 512 px
    harmon-0.5b          Qwen2.5-0.5B-Instruct + MAR-B (12 + 12 blocks, 768 wide) + head 6x1024, 512 px
    harmon-1.5b-random   the harmon-1.5b dimensions, for random-init benchmarks (byte-level tokenizer)
    harmon-tiny          the same layout at toy sizes for CPU tests: 6x6 tokens generated from position
                         embeddings learned for 4x4 (so the interpolation runs), a 2-level VAE

`build(name)` makes a random-init model; without the real Qwen tokenizer files it uses
`byte_tokenizer()`, a byte-level tokenizer with Qwen's chat special tokens (vocabulary 259).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from margrpo.heads import reinit_zero_layers_

from .config import HarmonConfig, MARConfig, VAEConfig
from .model import Harmon

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _qwen(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int = 151936) -> dict[str, Any]:
    """A Qwen2.5 config dict (the fields of its config.json that define the network)."""
    return {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }


PRESETS: dict[str, HarmonConfig] = {
    "harmon-1.5b": HarmonConfig(llm=_qwen(1536, 8960, 28, 12, 2), mar=MARConfig()),
    "harmon-0.5b": HarmonConfig(
        llm=_qwen(896, 4864, 24, 14, 2),
        mar=MARConfig(
            encoder_embed_dim=768,
            encoder_depth=12,
            encoder_num_heads=12,
            decoder_embed_dim=768,
            decoder_depth=12,
            decoder_num_heads=12,
            diffloss_d=6,
            diffloss_w=1024,
        ),
    ),
    "harmon-tiny": HarmonConfig(
        llm={**_qwen(32, 64, 2, 4, 2, vocab=259), "bos_token_id": 256, "eos_token_id": 258},
        mar=MARConfig(
            encoder_embed_dim=32,
            encoder_depth=1,
            encoder_num_heads=2,
            decoder_embed_dim=32,
            decoder_depth=1,
            decoder_num_heads=2,
            img_size=8,
            vae_stride=2,
            buffer_size=4,
            class_num=10,
            diffloss_d=2,
            diffloss_w=32,
            num_sampling_steps="4",
        ),
        vae=VAEConfig(ch=32, ch_mult=(1, 2), num_res_blocks=1, resolution=8, encoder_attn_resolutions=(4,)),
        image_size=12,
    ),
}
PRESETS["harmon-1.5b-random"] = PRESETS["harmon-1.5b"]


def preset(name: str) -> HarmonConfig:
    """A copy of the named architecture."""
    if name not in PRESETS:
        raise ValueError(f"preset: got {name!r}, expected one of {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges (every byte is a token) plus Qwen's chat special
    tokens: ids 0-255 bytes, 256 <|endoftext|> (padding), 257 <|im_start|>, 258 <|im_end|> (eos)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def build(
    name_or_config: str | HarmonConfig,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    tokenizer=None,
    head_std: float | None = 0.02,
    **options,
) -> Harmon:
    """A random-init Harmon of a preset (or config), in eval mode.

    head_std: re-initialise the head's adaLN-Zero layers with this std (None keeps the zero init,
    under which the head ignores z). options: Harmon's keyword arguments (trainable, ...).
    Without a tokenizer the byte tokenizer is used and the LLM's vocabulary shrunk to it."""
    config = preset(name_or_config) if isinstance(name_or_config, str) else copy.deepcopy(name_or_config)
    if tokenizer is None:
        tokenizer = byte_tokenizer()
        config.llm.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Harmon(config, tokenizer, **options)
    if head_std is not None:
        reinit_zero_layers_(model.head, std=head_std)
    if dtype is not None:
        model.to(dtype)
    if model.trainable == "mar+lora":
        model.enable_lora()
    return model.eval()
