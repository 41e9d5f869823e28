"""NovaBackbone: NOVA text-to-image behind margrpo.models.base.MARBackbone.

The policy is the NOVA transformer (`self.transformer`, official parameter names under the
"transformer." prefix); its diffusion head is `head`. The text encoder (Phi-2) and the VAE are frozen
pipeline parts kept outside the module tree: they are not policy parameters, a deepcopy (the
trainer's reference policy) shares them instead of copying ~3 B frozen weights, and `.to()` moves
them with the backbone.

Prompts: encode_prompts runs the text encoder and the prompt-only part of the transformer once per
batch, and returns PromptBatch.embeds = [text tokens (text_token_len) ; temporal condition tokens]
(mask all True: NOVA attends to every text position, the ones past a prompt hold learned rows).
forward_z then runs the spatial encoder at each mask step. Under gradient (the training
likelihood) the text projection and temporal encoder get their gradient through the embeds.

training_extra_frame (the MAR-GRPO reference code's training forward, for the parity preset): in
train() mode forward_z recomputes the temporal condition with a second frame holding the canvas,
as that code's likelihood does; eval() mode (rollout) is unchanged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from margrpo.diffusion import from_diffusers_config
from margrpo.heads import DiffusionMLP, unpatchify

from ..base import PromptBatch
from .config import NovaConfig
from .text import PhiTextEncoder
from .transformer import NovaTransformer
from .vae import LatentDecoder

NEGATIVE_PROMPT = ""  # NOVA's unconditional prompt
DIFFUSION_STEPS = 25  # NOVA's default sampling steps of the head's chain


class FrozenParts:
    """The text encoder and VAE: shared, not copied, by copy.deepcopy (see the module docstring)."""

    def __init__(self, text_encoder: PhiTextEncoder, vae: LatentDecoder):
        self.text_encoder, self.vae = text_encoder, vae

    def __deepcopy__(self, memo) -> "FrozenParts":
        return self

    def modules(self) -> list[nn.Module]:
        return [self.text_encoder.model, self.vae.vae]


class NovaBackbone(nn.Module):
    """NOVA as a MARBackbone: encode_prompts, negative_prompt, forward_z, decode, trainable_parameters,
    make_sampler, num_tokens, token_channels, head."""

    def __init__(
        self,
        transformer: NovaTransformer,
        text_encoder: PhiTextEncoder,
        vae: LatentDecoder,
        scheduler_config: dict,
        training_extra_frame: bool = False,
        flow_shift: float | None = None,
    ):
        super().__init__()
        config = transformer.config
        if text_encoder.hidden_size != config.text_token_dim:
            raise ValueError(
                f"text_encoder: hidden size {text_encoder.hidden_size}, expected the transformer's text_token_dim {config.text_token_dim}"
            )
        if vae.latent_channels != config.image_dim or vae.stride != config.image_stride:
            raise ValueError(
                f"vae: {vae.latent_channels} latent channels at stride {vae.stride}, expected "
                f"{config.image_dim} at stride {config.image_stride} (transformer config)"
            )
        if not isinstance(training_extra_frame, bool):
            raise ValueError(f"training_extra_frame: got {training_extra_frame!r}, expected a bool")
        self.transformer = transformer
        self.frozen = FrozenParts(text_encoder, vae)
        self.scheduler_config = copy.deepcopy(scheduler_config)
        scheduler_class = scheduler_config.get("_sample_class_name") or scheduler_config.get("_class_name")
        if flow_shift is not None and scheduler_class != "FlowMatchEulerDiscreteScheduler":
            raise ValueError(
                f"flow_shift: got {flow_shift!r}, but the checkpoint's scheduler is {scheduler_class!r}; "
                "flow_shift applies to a FlowMatchEulerDiscreteScheduler only (leave it unset)"
            )
        if flow_shift is not None:  # a bad value fails here, naming the option (FlowSDESampler checks it)
            from_diffusers_config(scheduler_config, 1, flow_shift=flow_shift)
        self.flow_shift = flow_shift
        self.training_extra_frame = training_extra_frame
        self.num_tokens, self.token_channels = config.num_tokens, config.token_channels

    @property
    def config(self) -> NovaConfig:
        return self.transformer.config

    @property
    def head(self) -> DiffusionMLP:
        return self.transformer.image_decoder

    def _apply(self, fn, recurse: bool = True):
        # .to() / .double() / .cuda() move the frozen parts with the policy
        super()._apply(fn, recurse)
        for module in self.frozen.modules():
            module._apply(fn)
        return self

    # ------------------------------------------------------------------ MARBackbone protocol
    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        """prompts -> PromptBatch(embeds [B, text_token_len + F, W] = [text tokens; temporal tokens], mask)."""
        if isinstance(prompts, str) or not len(prompts) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts: got {prompts!r}, expected a non-empty list of strings")
        text = self.transformer.text_tokens(self.frozen.text_encoder(list(prompts)))
        embeds = torch.cat([text, self.transformer.temporal(text)], 1)
        return PromptBatch(embeds, torch.ones(embeds.shape[:2], dtype=torch.bool, device=embeds.device))

    def negative_prompt(self) -> str:
        return NEGATIVE_PROMPT

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        """canvas [B, N, C] (read where known), known bool [B, N] -> z [B, N, W]. known_count: see
        MARBackbone.forward_z (given, the spatial encoder runs without a host read of `known`)."""
        batch, config = len(prompts), self.config
        if canvas.shape != (batch, self.num_tokens, self.token_channels):
            raise ValueError(f"canvas: got shape {tuple(canvas.shape)}, expected [{batch}, {self.num_tokens}, {self.token_channels}]")
        if known.shape != (batch, self.num_tokens) or known.dtype != torch.bool:
            raise ValueError(f"known: got {known.dtype} {tuple(known.shape)}, expected bool [{batch}, {self.num_tokens}]")
        expected = config.text_token_len + config.frame_tokens
        if prompts.embeds.shape[1:] != (expected, config.width):
            raise ValueError(
                f"prompts: got embeds {tuple(prompts.embeds.shape)}, expected [B, {expected}, {config.width}] "
                "from this backbone's encode_prompts"
            )
        dtype = self.transformer.mask_embed.mask_token.dtype
        embeds = prompts.embeds.to(dtype)
        text, cond = embeds[:, : config.text_token_len], embeds[:, config.text_token_len :]
        if self.training and self.training_extra_frame:
            shown = torch.where(known[..., None], canvas, torch.zeros((), dtype=canvas.dtype, device=canvas.device))
            cond = self.transformer.temporal(text, self.latent_images(shown))
        return self.transformer.spatial(cond, canvas.to(dtype), known, known_count)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N, C] (scaled latent patches) -> images float [B, 3, H, W] in [0, 1]."""
        if tokens.shape[1:] != (self.num_tokens, self.token_channels):
            raise ValueError(f"tokens: got shape {tuple(tokens.shape)}, expected [B, {self.num_tokens}, {self.token_channels}]")
        return self.frozen.vae(self.latent_images(tokens))

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every transformer parameter outside the diffusion head (frozen during GRPO)."""
        head = {id(p) for p in self.head.parameters()}
        return [p for p in self.transformer.parameters() if id(p) not in head]

    def make_sampler(self, num_steps: int | None = None):
        """The head's sampler from the checkpoint's scheduler_config.json (NOVA samples 25 steps), with
        NOVA's own semantics (margrpo.diffusion.from_diffusers_config): DDPM never clips x0, and the
        pipeline's flow_shift (given to the backbone) is the scheduler's set_shift, not its shift."""
        options = {} if self.flow_shift is None else {"flow_shift": self.flow_shift}
        return from_diffusers_config(self.scheduler_config, num_steps or DIFFUSION_STEPS, **options)

    # ------------------------------------------------------------------ helpers
    def latent_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, N, C] patch tokens -> latent images [B, c, h, w]."""
        height, width = self.config.latent_size
        return unpatchify(tokens, height, width, self.config.patch_size)
