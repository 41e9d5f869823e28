"""The NOVA text-to-image transformer (baaivision/NOVA NOVATransformer3DModel), module and parameter
names as in the official checkpoints so transformer/diffusion_pytorch_model.safetensors loads unchanged.

    text features [B, L, 2560] --text_embed (Linear + LN)--> text tokens [B, L, W]
    temporal encoder (video_encoder, 16 blocks): [text tokens ; frame tokens] -> frame tokens c [B, F, W]
        the frame of an image is F = (latent/2p)^2 copies of the learned BOS token plus the frame
        position embedding (a sincos time embedding through time_proj + LN, and a 2D sincos grid)
    spatial encoder (image_encoder, 32 blocks, MAE-style split at depth/2):
        tokens = patch_embed(canvas) where known, mask_token elsewhere, + 2D sincos positions
        first half: [c ; known tokens only];  second half: [c ; all tokens]  -> LN -> z [B, N, W]
    diffusion head (image_decoder): margrpo.heads.DiffusionMLP, conditioned on z per token

Blocks normalise the branch output (x + LN(attn(x)), x + LN(mlp(x))), as upstream. Attention is
bidirectional. The temporal encoder's input does not depend on the canvas for an image, so it is a
function of the prompt alone (`temporal(text)`); the reference MAR-GRPO training forward instead
appends a second frame that patch-embeds the current canvas (`temporal(text, canvas_image)`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from margrpo.heads import DiffusionMLP

from .config import NovaConfig

TEXT_BUFFER_ROWS = 512  # rows of text_embed.weight (the learned fill for positions past a prompt)
TIME_FREQUENCIES = 128  # sincos frequencies of the frame time embedding (256 features)


def sincos_grid(dim: int, height: int, width: int) -> torch.Tensor:
    """NOVA's 2D position table [height * width, dim]: [sin(w f), cos(w f), sin(h f), cos(h f)] with
    f_j = 10000^(-j / (dim/4)), rows in raster order (the flattened conv output's order)."""
    freq = 1.0 / (10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4)))
    grid_h, grid_w = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij")
    w = grid_w.reshape(-1, 1) * freq
    h = grid_h.reshape(-1, 1) * freq
    return torch.cat([w.sin(), w.cos(), h.sin(), h.cos()], dim=-1)


class Mlp(nn.Module):
    def __init__(self, dim: int, mlp_ratio: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * mlp_ratio)
        self.fc2 = nn.Linear(dim * mlp_ratio, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, D]; key_mask bool [B, 1, 1, L] (False: never attended to) or None."""
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.norm1(self.attn(x, key_mask))
        return x + self.norm2(self.mlp(x))


class PatchEmbed(nn.Module):
    def __init__(self, image_dim: int, dim: int, patch_size: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(image_dim, dim, patch_size, patch_size)

    def images(self, latents: torch.Tensor) -> torch.Tensor:
        """Latent images [B, c, H, W] -> tokens [B, (H/p)(W/p), D]."""
        return self.proj(latents).flatten(2).transpose(1, 2)

    def tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Patch tokens [B, N, p*p*c] in NOVA's (p_h, p_w, c) order -> [B, N, D]: the conv as a Linear."""
        weight = self.proj.weight.permute(0, 2, 3, 1).reshape(self.proj.weight.shape[0], -1)
        return F.linear(tokens, weight, self.proj.bias)


class AdaLayerNorm(nn.Module):
    """The temporal encoder's frame mixer of NOVA video models (video_mixer_rank): loaded so a
    checkpoint that carries it fits, never applied to images (one frame has nothing to mix)."""

    def __init__(self, dim: int, rank: int):
        super().__init__()
        self.lora = nn.Linear(dim, rank, bias=False) if rank > 0 else nn.Identity()
        self.proj = nn.Linear(rank if rank > 0 else dim, 2 * dim)


class Encoder(nn.Module):
    """A NOVA VisionTransformer: patch_embed, blocks, norm (and, for video models, a mixer)."""

    def __init__(self, depth: int, dim: int, num_heads: int, patch_size: int, image_dim: int, mixer_rank: int | None = None):
        super().__init__()
        self.patch_embed = PatchEmbed(image_dim, dim, patch_size)
        self.blocks = nn.ModuleList(Block(dim, num_heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.encoder_depth = depth // 2  # the spatial encoder's MAE split (upstream default)
        if mixer_rank:
            self.mixer = AdaLayerNorm(dim, mixer_rank)


class TextEmbed(nn.Module):
    """proj + LN of text features; `weight` (a buffer, as upstream) fills positions past a prompt."""

    def __init__(self, token_dim: int, dim: int, num_tokens: int):
        super().__init__()
        self.num_tokens = num_tokens
        self.proj = nn.Linear(token_dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("weight", torch.randn(TEXT_BUFFER_ROWS, token_dim) * 0.02)

    def features(self, per_prompt: list[torch.Tensor]) -> torch.Tensor:
        """Per-prompt encoder states [n_i, token_dim] (n_i <= num_tokens) -> [B, num_tokens, token_dim]."""
        rows = self.weight[: self.num_tokens]
        out = rows.expand(len(per_prompt), -1, -1).clone()
        for i, states in enumerate(per_prompt):
            out[i, : states.shape[0]] = states.to(out.dtype)
        return out

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(features))


class MaskEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bos_token = nn.Parameter(torch.randn(1, dim) * 0.02)
        self.mask_token = nn.Parameter(torch.randn(1, dim) * 0.02)


class VideoPosEmbed(nn.Module):
    """Frame positions: LN(time_proj(sincos(t))) per frame plus a 2D sincos grid per token."""

    def __init__(self, dim: int, base_size: tuple[int, int, int]):
        super().__init__()
        self.base_frames = base_size[0]
        self.time_proj = nn.Sequential(nn.Linear(2 * TIME_FREQUENCIES, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("space", sincos_grid(dim, *base_size[1:]), persistent=False)

    def time_embed(self, frames: int) -> torch.Tensor:
        """[frames, 1, D]; frame t sits at t / (frames / base_frames) as upstream."""
        freq = 1.0 / (10000 ** (torch.arange(TIME_FREQUENCIES, dtype=torch.float32) / TIME_FREQUENCIES))
        grid = torch.arange(frames, dtype=torch.float32) / (frames / self.base_frames)
        angles = grid.view(-1, 1, 1) * freq.to(grid.device)
        sincos = torch.cat([angles.sin(), angles.cos()], dim=-1)
        weight = self.time_proj[0].weight
        return self.norm(self.time_proj(sincos.to(device=weight.device, dtype=weight.dtype)))


class NovaTransformer(nn.Module):
    """NOVATransformer3DModel for images: official submodule names, forward split into the prompt
    part (text_tokens, temporal) and the per-mask-step part (spatial)."""

    def __init__(self, config: NovaConfig):
        super().__init__()
        self.config = config
        t_depth, width, t_heads = config.temporal
        s_depth, _, s_heads = config.spatial
        h_depth, h_width = config.head
        p = config.patch_size
        self.video_encoder = Encoder(t_depth, width, t_heads, config.temporal_patch_size, config.image_dim, config.video_mixer_rank)
        self.image_encoder = Encoder(s_depth, width, s_heads, p, config.image_dim)
        self.image_decoder = DiffusionMLP(h_depth, h_width, width, p, config.image_dim)
        self.mask_embed = MaskEmbed(width)
        self.text_embed = TextEmbed(config.text_token_dim, width, config.text_token_len)
        self.video_pos_embed = VideoPosEmbed(width, config.video_base_size)
        self.register_buffer("image_pos", sincos_grid(width, *config.image_base_size), persistent=False)

    def text_tokens(self, per_prompt: list[torch.Tensor]) -> torch.Tensor:
        """Per-prompt text-encoder states -> text tokens [B, text_token_len, W]."""
        return self.text_embed(self.text_embed.features(per_prompt))

    def temporal(self, text: torch.Tensor, canvas_image: torch.Tensor | None = None) -> torch.Tensor:
        """Text tokens [B, L, W] -> the spatial encoder's condition tokens [B, F, W] (the BOS frame).

        canvas_image [B, c, h, w] (the reference training forward): a second frame of the canvas's
        temporal patch embedding follows the BOS frame, and both frames' tokens [B, 2F, W] are returned.
        """
        batch, frame = text.shape[0], self.config.frame_tokens
        frames = [self.mask_embed.bos_token.expand(batch, frame, -1)]
        if canvas_image is not None:
            frames.append(self.video_encoder.patch_embed.images(canvas_image.to(text.dtype)))
        x = torch.stack(frames, 1) + self.video_pos_embed.time_embed(len(frames)) + self.video_pos_embed.space
        h = torch.cat([text, x.flatten(1, 2)], 1)
        for block in self.video_encoder.blocks:
            h = block(h)
        return self.video_encoder.norm(h[:, text.shape[1] :])

    def spatial(self, cond: torch.Tensor, tokens: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        """Condition tokens [B, F, W], canvas tokens [B, N, C] (read where known), known bool [B, N]
        -> z [B, N, W].

        The first half of the blocks sees only the known tokens (gathered in position order; rows
        with fewer known tokens than the batch's most are padded and the padding masked out of
        attention), the second half every token. known_count (the count of every row, when the
        caller knows it) avoids reading the counts back to the host (two syncs on a GPU)."""
        encoder = self.image_encoder
        x = encoder.patch_embed.tokens(tokens.to(cond.dtype))
        x = torch.where(known[..., None], x, self.mask_embed.mask_token) + self.image_pos
        if known_count is None:
            counts = known.sum(1)
            most = int(counts.max())
            valid = torch.arange(most, device=known.device) < counts[:, None]
            ragged = not bool(valid.all())
        else:
            most, ragged = known_count, False
        # known positions first, each group in position order
        visible_at = torch.argsort((~known).to(torch.int32), dim=1, stable=True)[:, :most]
        index = visible_at[..., None].expand(-1, -1, x.shape[-1])
        visible = x.gather(1, index)
        key_mask = None
        if ragged:
            key_mask = torch.cat([valid.new_ones(valid.shape[0], cond.shape[1]), valid], 1)[:, None, None, :]
        h = torch.cat([cond, visible], 1)
        for block in encoder.blocks[: encoder.encoder_depth]:
            h = block(h, key_mask)
        cond_out, visible_out = h.split([cond.shape[1], most], 1)
        if ragged:  # padding slots hold unknown positions: leave those as they were
            visible_out = torch.where(valid[..., None], visible_out, visible)
        # under autocast the blocks' output can be bf16 while x (float32 mask token and positions) is not:
        # scatter needs one dtype, and x's is the residual stream's (the dtype without autocast)
        h = torch.cat([cond_out, x.scatter(1, index, visible_out.to(x.dtype))], 1)
        for block in encoder.blocks[encoder.encoder_depth :]:
            h = block(h)
        return encoder.norm(h[:, cond.shape[1] :])
