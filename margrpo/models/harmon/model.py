"""Harmon (wusize/Harmon: Qwen2.5 + MAR + KL-16 VAE) as a margrpo.models.base.MARBackbone.

One forward_z, as Harmon samples:
    x_enc = MAR encoder(known tokens + 64 buffer slots)                          mar.encode
    h = LLM([prompt ; proj_in(x_enc) with the buffer moved to the end])         llm.image_states
    z = MAR decoder(x_enc + proj_out(h with the buffer moved back))             mar.decode
and the frozen diffusion head `mar.diffloss.net` (SimpleMLPAdaLN 12x1536, learned-range variance)
turns z into tokens through the IDDPM cosine sampler (make_sampler). decode() maps tokens through
the VAE (tokens / 0.2325). Module names are the official ones, so `state_dict()` keys are those of
the released checkpoints (vae.*, llm.*, mar.*, proj_in.*, proj_out.*).

Prompts: a prompt p becomes the chat turn "<|im_start|>user\\nGenerate an image: p<|im_end|>\\n
<|im_start|>assistant\\n"; the negative prompt "Generate an image." is used as the whole user turn.

reference_behaviour=True reproduces, at the backbone level, what the reference GRPO code does
(AMAP-ML/mar-grpo) for the parity preset: MAR dropout (0.1) is active in a training-mode forward
that records gradients (the policy's likelihood pass; rollouts and the frozen reference model run
without gradient, so never there), and within one generation the unconditional (negative-prompt)
rows see the canvas of the previous forward_z call, i.e. the CFG canvas lags one mask step. The
default (False) has no dropout and the same canvas for both CFG halves.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from margrpo.diffusion import DDPMSampler, mar_sampler
from margrpo.models.base import PromptBatch

from . import llm as llm_utils
from .config import HarmonConfig
from .mar import MAR
from .vae import AutoencoderKL

INSTRUCTION = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
GENERATION = "Generate an image: {prompt}"
NEGATIVE_PROMPT = "Generate an image."
TRAINABLE = ("mar", "mar+llm", "mar+lora")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _mlp(width_in: int, width_out: int, hidden: int) -> nn.Sequential:
    """proj_in / proj_out: Linear, SiLU, Linear (keys 0.* and 2.*)."""
    return nn.Sequential(nn.Linear(width_in, hidden), nn.SiLU(), nn.Linear(hidden, width_out))


@dataclass
class _PromptState:
    """What forward_z keeps for the prompt batch it last saw: the prompt KV (when it carries no graph)
    and, for reference_behaviour, the negative-prompt rows and the previous call's canvas."""

    batch: weakref.ref
    versions: tuple  # (autocast dtype, in-place versions of the prompt tensors and LLM parameters)
    kv: llm_utils.PromptKV
    negative_rows: torch.Tensor | None = None
    previous_canvas: torch.Tensor | None = None


class _PromptCache:
    """Single-entry holder; a deep copy (the trainer's frozen reference model) starts empty."""

    def __init__(self) -> None:
        self.state: _PromptState | None = None

    def __deepcopy__(self, memo) -> "_PromptCache":
        return _PromptCache()


class Harmon(nn.Module):
    """Harmon behind the MARBackbone protocol (see the module docstring).

    Args:
        config: the architecture (HarmonConfig; presets.py has the official sizes).
        tokenizer: a transformers tokenizer of the LLM (the checkpoint's, or presets.byte_tokenizer()).
        trainable: what trainable_parameters() returns: "mar" (MAR encoder/decoder, the paper's
            default), "mar+llm" (also the LLM and proj_in/proj_out), "mar+lora" (also LoRA adapters
            on the LLM's projections, via peft; enable_lora() adds them after the weights are loaded).
        reference_behaviour: reproduce the reference GRPO code's dropout and lagging CFG canvas.
        gradient_checkpointing: recompute MAR blocks and the LLM pass in backward (training memory).
        lora_rank: LoRA rank for trainable="mar+lora" (alpha = 2 * rank).
    """

    def __init__(
        self,
        config: HarmonConfig,
        tokenizer,
        *,
        trainable: Literal["mar", "mar+llm", "mar+lora"] = "mar",
        reference_behaviour: bool = False,
        gradient_checkpointing: bool = True,
        lora_rank: int = 16,
    ):
        super().__init__()
        if trainable not in TRAINABLE:
            raise ValueError(f"trainable: got {trainable!r}, expected one of {', '.join(TRAINABLE)}")
        self.config = config
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"  # image positions continue each row's real prompt
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.trainable, self.lora_rank = trainable, lora_rank
        self.reference_behaviour = reference_behaviour
        self.gradient_checkpointing = gradient_checkpointing
        self.num_tokens = config.grid**2
        self.token_channels = config.mar.token_channels

        self.vae = AutoencoderKL(config.vae)
        self.llm = llm_utils.build_llm(config.llm)
        self.mar = MAR(config.mar, dropout=reference_behaviour, gradient_checkpointing=gradient_checkpointing)
        hidden, width = self.llm.config.hidden_size, config.mar.encoder_embed_dim
        self.proj_in = _mlp(width, hidden, hidden)
        self.proj_out = _mlp(hidden, width, hidden)
        self._prompt_cache = _PromptCache()
        self._lora_ready = False

    @property
    def head(self) -> nn.Module:
        """The diffusion head, `mar.diffloss.net` (a property, so its parameters keep their official names)."""
        return self.mar.diffloss.net

    # ------------------------------------------------------------------ MARBackbone protocol
    def negative_prompt(self) -> str:
        return NEGATIVE_PROMPT

    def format_prompt(self, prompt: str) -> str:
        """The chat text Harmon's LLM reads for `prompt` (the negative prompt is used as is)."""
        text = prompt if prompt == NEGATIVE_PROMPT else GENERATION.format(prompt=prompt)
        return INSTRUCTION.format(input=text)

    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        """Prompts -> the LLM's input embeddings [B, L, H] of the chat text (right-padded) and mask [B, L]."""
        if isinstance(prompts, str) or not len(prompts):
            raise ValueError(f"prompts: got {prompts!r}, expected a non-empty list of prompt strings")
        bad = [p for p in prompts if not isinstance(p, str) or not p.strip()]
        if bad:
            raise ValueError(f"prompts: got {bad[:3]!r}, expected non-empty strings")
        encoded = self.tokenizer([self.format_prompt(p) for p in prompts], add_special_tokens=True, padding=True, return_tensors="pt")
        embedding = self.llm.get_input_embeddings()
        ids = encoded["input_ids"].to(embedding.weight.device)
        return PromptBatch(embedding(ids), encoded["attention_mask"].to(ids.device).bool())

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        """canvas [B, N, C] (read where known), known bool [B, N] (the same count in every row) -> z [B, N, D].

        known_count: that count when the caller knows it (see MARBackbone.forward_z); without it the
        counts are read back and checked (two syncs on a GPU)."""
        batch = len(prompts)
        if canvas.shape != (batch, self.num_tokens, self.token_channels):
            raise ValueError(f"canvas: got shape {tuple(canvas.shape)}, expected [{batch}, {self.num_tokens}, {self.token_channels}]")
        if known.shape != (batch, self.num_tokens) or known.dtype != torch.bool:
            raise ValueError(f"known: got {known.dtype} {tuple(known.shape)}, expected bool [{batch}, {self.num_tokens}]")
        if known_count is None:
            counts = known.sum(1)
            if bool((counts != counts[0]).any()):
                raise ValueError(
                    f"known: got {sorted(set(counts.tolist()))} known tokens across rows, expected the "
                    "same count in every row (Harmon's encoder keeps a [B, n] block of known tokens)"
                )
            known_count = int(counts[0])
        state, kv = self._prompt_kv(prompts)
        if self.reference_behaviour and state is not None:
            canvas = self._lagging_canvas(state, prompts, canvas)
        dtype = self.mar.z_proj.weight.dtype
        # positions of the known tokens, ascending in every row (a stable sort puts known first)
        visible = torch.argsort((~known).to(torch.uint8), dim=1, stable=True)[:, :known_count]
        side, buffer = self.config.grid, self.config.mar.buffer_size
        x_enc = self.mar.encode(canvas.to(dtype), visible, side)
        z_enc = self.proj_in(x_enc)
        z_enc = torch.cat([z_enc[:, buffer:], z_enc[:, :buffer]], 1)  # the buffer goes last in the LLM
        h = self._image_states(kv, z_enc)
        h = torch.cat([h[:, -buffer:], h[:, :-buffer]], 1)
        return self.mar.decode(x_enc + self.proj_out(h), visible, side)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N, C] -> images float32 [B, 3, H, W] in [0, 1] (VAE decode of tokens / vae_scale)."""
        if tokens.dim() != 3 or tokens.shape[1:] != (self.num_tokens, self.token_channels):
            raise ValueError(f"tokens: got shape {tuple(tokens.shape)}, expected [B, {self.num_tokens}, {self.token_channels}]")
        p, side, c = self.config.mar.patch_size, self.config.grid, self.config.mar.vae_embed_dim
        latents = tokens.reshape(-1, side, side, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(-1, c, side * p, side * p)
        images = self.vae.decode((latents / self.config.vae_scale).to(self.vae.post_quant_conv.weight.dtype))
        return images.float().add(1).div(2).clamp(0, 1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters GRPO updates (see `trainable`); never the head, the VAE or the unused class_emb."""
        skip = {id(p) for p in (*self.head.parameters(), self.mar.class_emb.weight)}
        params = [p for p in self.mar.parameters() if id(p) not in skip]
        if self.trainable == "mar+llm":
            params += [*self.proj_in.parameters(), *self.proj_out.parameters(), *self.llm.model.parameters()]
        elif self.trainable == "mar+lora":
            if not self._lora_ready:
                raise RuntimeError("trainable='mar+lora': call enable_lora() after loading the weights (margrpo.models.harmon.load does)")
            params += [p for name, p in self.llm.named_parameters() if "lora_" in name]
        return params

    # ------------------------------------------------------------------ sampling, images, LoRA
    def make_sampler(self, num_steps: int | str | None = None) -> DDPMSampler:
        """The head's IDDPM sampler: cosine schedule, eps prediction, learned-range variance, respaced
        from 1000 steps to `num_steps` (default: the checkpoint's num_sampling_steps, "100")."""
        return mar_sampler(num_steps or self.config.mar.num_sampling_steps, "cosine", learn_sigma=True)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, H, W] in [0, 1] at image_size -> tokens [B, N, C] (inverse of decode)."""
        size = self.config.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
            raise ValueError(f"images: got shape {tuple(images.shape)}, expected [B, 3, {size}, {size}]")
        p, side = self.config.mar.patch_size, self.config.grid
        latents = self.vae.encode((images * 2 - 1).to(self.vae.post_quant_conv.weight.dtype)) * self.config.vae_scale
        c = latents.shape[1]
        return latents.reshape(-1, c, side, p, side, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, self.num_tokens, c * p * p)

    def enable_lora(self) -> None:
        """Inject LoRA adapters (peft) into the LLM's attention and MLP projections, once. Call it after
        loading weights: the adapted layers keep their base weights under new names (base_layer)."""
        if self._lora_ready:
            return
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError as err:
            raise ImportError("trainable='mar+lora' needs the peft package (pip install peft)") from err
        lora = LoraConfig(r=self.lora_rank, lora_alpha=2 * self.lora_rank, target_modules=list(LORA_TARGETS))
        inject_adapter_in_model(lora, self.llm.model)
        self.llm.to(self.mar.fake_latent.device)
        self._lora_ready = True

    # ------------------------------------------------------------------ prompt KV cache
    def _llm_versions(self) -> tuple[int, ...]:
        """In-place update counters of the LLM's parameters: an optimizer step changes them."""
        return tuple(p._version for p in self.llm.parameters())

    def _prompt_kv(self, prompts: PromptBatch) -> tuple[_PromptState | None, llm_utils.PromptKV]:
        """The prompt KV of `prompts`: reused while the same batch comes back with the same LLM weights
        under the same autocast (a rollout's mask steps); recomputed at every call when it must carry
        gradient (a graph must not outlive the backward pass it belongs to)."""
        if torch.is_grad_enabled() and (prompts.embeds.requires_grad or any(p.requires_grad for p in self.llm.parameters())):
            return None, llm_utils.prompt_kv(self.llm, prompts.embeds, prompts.mask)
        device = prompts.embeds.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        versions = (autocast, prompts.embeds._version, prompts.mask._version, *self._llm_versions())
        state = self._prompt_cache.state
        if state is not None and state.batch() is prompts and state.versions == versions:
            return state, state.kv
        kv = llm_utils.prompt_kv(self.llm, prompts.embeds, prompts.mask)
        self._prompt_cache.state = _PromptState(weakref.ref(prompts), versions, kv)
        return self._prompt_cache.state, kv

    def _image_states(self, kv: llm_utils.PromptKV, image: torch.Tensor) -> torch.Tensor:
        remat = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        if remat:
            return checkpoint(llm_utils.image_states, self.llm, kv, image, use_reentrant=False)
        return llm_utils.image_states(self.llm, kv, image)

    # ------------------------------------------------------------------ reference behaviour
    def _negative_rows(self, prompts: PromptBatch) -> torch.Tensor:
        """bool [B]: rows holding exactly the encoded negative prompt (the CFG unconditional rows)."""
        negative = self.encode_prompts([NEGATIVE_PROMPT])
        length = negative.embeds.shape[1]
        if prompts.embeds.shape[1] < length:
            return torch.zeros(len(prompts), dtype=torch.bool, device=prompts.mask.device)
        same_text = (prompts.embeds[:, :length] == negative.embeds.to(prompts.embeds.dtype)).flatten(1).all(1)
        same_length = prompts.mask[:, :length].all(1) & ~prompts.mask[:, length:].any(1)
        return same_text & same_length

    def _lagging_canvas(self, state: _PromptState, prompts: PromptBatch, canvas: torch.Tensor) -> torch.Tensor:
        """The reference code's CFG canvas: unconditional rows see the previous call's canvas."""
        if state.negative_rows is None:
            state.negative_rows = self._negative_rows(prompts)
        previous, state.previous_canvas = state.previous_canvas, canvas.detach().clone()
        if previous is None or previous.shape != canvas.shape:
            return canvas
        return torch.where(state.negative_rows[:, None, None], previous.to(canvas.dtype), canvas)
