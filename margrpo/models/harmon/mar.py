"""The MAR encoder/decoder of Harmon (wusize/Harmon src/models/mar/mar.py), with official names.

    tokens --z_proj--> + position --z_proj_ln--> keep [64 buffer ; known tokens] --encoder_blocks-->
    encoder_norm = x_enc  (Harmon sends x_enc through the LLM and adds the result back, see model.py)
    x_enc --decoder_embed--> scatter into [buffer ; mask_token everywhere] + position --decoder_blocks-->
    decoder_norm, drop the buffer, + diffusion_pos_embed_learned = z for every token position

The buffer positions hold `fake_latent` (Harmon's text condition arrives through the LLM instead of a
class embedding; `class_emb` stays for the checkpoint's keys but is never used). Position embeddings
are learned for img_size / vae_stride tokens per side (16 for Harmon) and bilinearly interpolated to
the generation grid (32 at 512 px). Blocks are timm ViT blocks (pre-LN attention + GELU MLP, qkv
bias) under the same parameter names. Dropout (attn_dropout / proj_dropout) is applied only when the
model is built with `dropout=True` (the reference code's training forward), and then only in a
training-mode forward that records gradients: the policy's likelihood pass, never a rollout or the
frozen reference model's pass (both run without gradient), as in the reference code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from margrpo.heads import SimpleMLPAdaLN

from .config import MARConfig

LN_EPS = 1e-6


def _dropout_on(module: nn.Module) -> bool:
    """Dropout runs only in a training-mode forward that records gradients (see the module docstring)."""
    return module.training and torch.is_grad_enabled()


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, attn_drop: float, proj_drop: float):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop, self.proj_drop = attn_drop, proj_drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        active = _dropout_on(self)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if active else 0.0)
        out = self.proj(out.transpose(1, 2).reshape(batch, length, dim))
        return F.dropout(out, self.proj_drop, training=active)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.drop = drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        active = _dropout_on(self)
        h = F.dropout(F.gelu(self.fc1(x)), self.drop, training=active)
        return F.dropout(self.fc2(h), self.drop, training=active)


class Block(nn.Module):
    """Pre-LayerNorm transformer block (timm VisionTransformer Block names: norm1, attn, norm2, mlp)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn_drop: float, proj_drop: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LN_EPS)
        self.attn = Attention(dim, num_heads, attn_drop, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=LN_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DiffLoss(nn.Module):
    """Holds the diffusion head under the official name `diffloss.net` (the loss itself is not needed)."""

    def __init__(self, config: MARConfig):
        super().__init__()
        channels = config.token_channels
        self.net = SimpleMLPAdaLN(channels, config.diffloss_w, 2 * channels, config.decoder_embed_dim, config.diffloss_d)


class MAR(nn.Module):
    """Harmon's MAR: encode(tokens, known, side) -> x_enc; decode(x_enc, known, side) -> z."""

    def __init__(self, config: MARConfig, dropout: bool = False, gradient_checkpointing: bool = False):
        super().__init__()
        self.config = config
        self.gradient_checkpointing = gradient_checkpointing
        enc, dec, positions = config.encoder_embed_dim, config.decoder_embed_dim, config.seq_side**2 + config.buffer_size
        attn_drop = config.attn_dropout if dropout else 0.0
        proj_drop = config.proj_dropout if dropout else 0.0

        self.class_emb = nn.Embedding(config.class_num, enc)
        self.fake_latent = nn.Parameter(torch.zeros(1, enc))
        self.z_proj = nn.Linear(config.token_channels, enc)
        self.z_proj_ln = nn.LayerNorm(enc, eps=LN_EPS)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, positions, enc))
        self.encoder_blocks = nn.ModuleList(
            Block(enc, config.encoder_num_heads, config.mlp_ratio, attn_drop, proj_drop) for _ in range(config.encoder_depth)
        )
        self.encoder_norm = nn.LayerNorm(enc, eps=LN_EPS)

        self.decoder_embed = nn.Linear(enc, dec)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, positions, dec))
        self.decoder_blocks = nn.ModuleList(
            Block(dec, config.decoder_num_heads, config.mlp_ratio, attn_drop, proj_drop) for _ in range(config.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(dec, eps=LN_EPS)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, config.seq_side**2, dec))
        self._init_weights()
        # built after the init above: the head keeps its own (adaLN-Zero) initialisation
        self.diffloss = DiffLoss(config)

    def _init_weights(self) -> None:
        """The official MAR init (normal 0.02 embeddings, xavier Linears, unit LayerNorms)."""
        for param in (
            self.class_emb.weight,
            self.fake_latent,
            self.mask_token,
            self.encoder_pos_embed_learned,
            self.decoder_pos_embed_learned,
            self.diffusion_pos_embed_learned,
        ):
            nn.init.normal_(param, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ position embeddings
    def _grid_positions(self, table: torch.Tensor, side: int, buffer: int) -> torch.Tensor:
        """[1, buffer + s*s, D] learned for s = seq_side -> [buffer + side*side, D] (image part bilinear)."""
        learned = self.config.seq_side
        if side == learned:
            return table[0]
        image = table[:, buffer:].reshape(1, learned, learned, -1).permute(0, 3, 1, 2)
        image = F.interpolate(image, size=(side, side), mode="bilinear")
        return torch.cat([table[0, :buffer], image.flatten(2).transpose(1, 2)[0]])

    # ------------------------------------------------------------------ encoder / decoder
    def _blocks(self, blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        remat = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False) if remat else block(x)
        return x

    def encode(self, tokens: torch.Tensor, visible: torch.Tensor, side: int) -> torch.Tensor:
        """tokens [B, N, C]; visible int64 [B, n] (the known positions, ascending) -> x_enc [B, buffer + n, D]."""
        buffer, batch = self.config.buffer_size, tokens.shape[0]
        pos = self._grid_positions(self.encoder_pos_embed_learned, side, buffer)
        known = tokens.gather(1, visible[..., None].expand(-1, -1, tokens.shape[-1]))
        # the projection, position and LayerNorm are per token: only the kept tokens are computed
        x = torch.cat([(self.fake_latent + pos[:buffer]).expand(batch, -1, -1), self.z_proj(known) + pos[buffer + visible]], 1)
        return self.encoder_norm(self._blocks(self.encoder_blocks, self.z_proj_ln(x)))

    def decode(self, x_enc: torch.Tensor, visible: torch.Tensor, side: int) -> torch.Tensor:
        """x_enc [B, buffer + n, D]; visible [B, n] -> z [B, side*side, D_dec] for every token position."""
        buffer, batch = self.config.buffer_size, x_enc.shape[0]
        x = self.decoder_embed(x_enc)
        full = self.mask_token.expand(batch, buffer + side * side, -1)
        # buffer slots and known tokens take the encoder's output, masked positions the mask token
        slots = torch.cat([torch.arange(buffer, device=visible.device).expand(batch, -1), buffer + visible], 1)
        # decoder_embed's output is bf16 under autocast while the mask token stays float32: one dtype
        full = full.scatter(1, slots[..., None].expand(-1, -1, x.shape[-1]), x.to(full.dtype))
        x = full + self._grid_positions(self.decoder_pos_embed_learned, side, buffer)
        x = self.decoder_norm(self._blocks(self.decoder_blocks, x))[:, buffer:]
        return x + self._grid_positions(self.diffusion_pos_embed_learned, side, 0)
