"""Harmon's language model: Qwen2.5 through transformers, with a prompt KV cache.

Harmon runs [prompt tokens ; visible image tokens ; 64 buffer tokens] through the causal LLM and
keeps the hidden states of the image part. The prompt part is the same at every mask step, so its
keys and values are computed once (`PromptKV`) and each step runs only the image part on top of
them. Every step starts from the stored prompt tensors in a fresh cache object, so a step never
sees the previous step's image tokens and nothing grows across calls (the reference training code
reuses one cache object and lets it grow).

Positions follow the official code: prompts are right-padded, padding is masked out, and image
positions continue from each row's real prompt length.

transformers moved things between versions (4.4x: `past_key_values=`, `cache.key_cache`; 4.56+:
`cache.layers[i].keys`; 5.x: `cache=`); the helpers below accept each.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import nn


def build_llm(config: dict[str, Any], attn_implementation: str = "sdpa") -> nn.Module:
    """A randomly initialised Qwen2ForCausalLM from a config dict (the module named `llm` in Harmon)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    qwen = Qwen2Config.from_dict(config)
    qwen._attn_implementation = attn_implementation
    return Qwen2ForCausalLM(qwen)


@lru_cache(maxsize=None)
def _cache_keyword(forward) -> str:
    """The keyword the transformers version at hand uses for the KV cache argument."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _output_cache(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) [B, kv_heads, L, head_dim] of a transformers cache."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]


def _new_cache(tensors: list[tuple[torch.Tensor, torch.Tensor]]):
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    for layer, (keys, values) in enumerate(tensors):
        cache.update(keys, values, layer)
    return cache


@dataclass
class PromptKV:
    """The LLM's keys and values of a prompt batch: per layer [B, kv_heads, L, head_dim], and the mask [B, L]."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor

    @property
    def requires_grad(self) -> bool:
        return any(k.requires_grad or v.requires_grad for k, v in self.tensors)


def prompt_kv(llm: nn.Module, embeds: torch.Tensor, mask: torch.Tensor) -> PromptKV:
    """Run the prompt embeddings [B, L, H] (right-padded, mask [B, L]) and keep every layer's KV."""
    model = llm.model
    bias = causal_bias(mask, mask.shape[1], embeds.dtype)
    output = model(inputs_embeds=embeds, attention_mask=bias, use_cache=True)
    return PromptKV(_cache_tensors(_output_cache(output)), mask)


def causal_bias(key_mask: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask [B, 1, l, K] of the last l of K positions attending causally to
    keys whose key_mask [B, K] is True. Given ready-made, transformers uses it as is instead of
    reading the padding mask back to decide whether it may skip the mask (a host sync per LLM call)."""
    keys, device = key_mask.shape[1], key_mask.device
    query_at = torch.arange(keys - length, keys, device=device)
    sees = (torch.arange(keys, device=device) <= query_at[:, None]) & key_mask[:, None, :]
    return torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill_(~sees, torch.finfo(dtype).min)[:, None]


def image_states(llm: nn.Module, prompt: PromptKV, image: torch.Tensor) -> torch.Tensor:
    """Hidden states [B, l, H] (after the final norm) of image embeddings [B, l, H] placed after the prompt."""
    model = llm.model
    batch, length = image.shape[:2]
    mask = torch.cat([prompt.mask, prompt.mask.new_ones(batch, length)], 1)
    positions = (mask.long().cumsum(1) - 1)[:, -length:]
    cache = {_cache_keyword(type(model).forward): _new_cache(prompt.tensors)}
    bias = causal_bias(mask, length, image.dtype)
    output = model(inputs_embeds=image, attention_mask=bias, position_ids=positions, use_cache=True, **cache)
    return output.last_hidden_state
