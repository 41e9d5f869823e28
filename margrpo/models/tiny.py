"""The tiny text-conditional MAR model of the ShapesWorld testbed (a margrpo.models.base.MARBackbone).

    prompt words --embed--> [prompt tokens ; image tokens] --bidirectional transformer--> z per image token
    image tokens: 4x4x3 pixel patches scaled to [-1, 1] (48 channels, 64 tokens on 32x32), or a
    learned mask token where unknown; learned position embeddings for both parts (image positions
    start as a 2D sin-cos code), optionally a learned 2D relative attention bias between image tokens
    (TinyMARConfig.relative_position_bias; off in the shipped checkpoint, see
    margrpo/checkpoints/shapes-tiny/README.md: it lifts the held-out verifier score from 0.30 to 0.51, but 20
    CPU GRPO steps no longer move that stronger model measurably).
    z --SimpleMLPAdaLN (margrpo.heads)--> a token, by a DDPM chain (make_sampler()).

The tokenizer is word level over the ShapesWorld vocabulary plus the negative prompt "an image"
(used for classifier-free guidance and prompt dropout in pretraining). Checkpoints are a directory
with model.safetensors and config.json (TinyMARConfig); TinyMAR.load checks every key and shape.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from margrpo.diffusion import DDPMSampler
from margrpo.heads import SimpleMLPAdaLN
from margrpo.testbed.grammar import VOCABULARY

from .base import PromptBatch

NEGATIVE_PROMPT = "an image"
PAD = "<pad>"
WEIGHTS_FILE, CONFIG_FILE = "model.safetensors", "config.json"


@dataclass
class TinyMARConfig:
    """Architecture of the tiny MAR (everything needed to rebuild it from config.json)."""

    image_size: int = 32
    patch_size: int = 4
    width: int = 128  # transformer width = z width
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    max_prompt_words: int = 12
    head_width: int = 128
    head_depth: int = 3
    diffusion_steps: int = 20  # sampling steps of the head's DDPM chain (training uses all 1000)
    noise_schedule: str = "cosine"
    relative_position_bias: bool = False  # learned 2D relative attention bias between image tokens

    def __post_init__(self) -> None:
        positive = (
            "image_size",
            "patch_size",
            "width",
            "depth",
            "num_heads",
            "max_prompt_words",
            "head_width",
            "head_depth",
            "diffusion_steps",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: got {value!r}, expected a positive integer")
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size: got {self.patch_size}, expected a divisor of image_size {self.image_size}")
        if not isinstance(self.mlp_ratio, (int, float)) or self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio: got {self.mlp_ratio!r}, expected a positive number")
        if self.width % self.num_heads:
            raise ValueError(f"num_heads: got {self.num_heads}, expected a divisor of width {self.width}")
        if not isinstance(self.relative_position_bias, bool):
            raise ValueError(f"relative_position_bias: got {self.relative_position_bias!r}, expected true or false")
        if self.noise_schedule not in ("cosine", "linear"):
            raise ValueError(f"noise_schedule: got {self.noise_schedule!r}, expected 'cosine' or 'linear'")

    @property
    def grid(self) -> int:
        """Tokens per image side."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        """N, tokens per image."""
        return self.grid**2

    @property
    def token_channels(self) -> int:
        """C, channels per token (a patch's pixels)."""
        return 3 * self.patch_size**2


def sincos_2d(grid: int, width: int) -> torch.Tensor:
    """[grid * grid, width] position code: half the channels encode the row, half the column, each as
    sines and cosines of geometric frequencies (row-major token order, as patchify)."""
    quarter = width // 4
    freqs = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    parts = []
    for coord in (rows.flatten(), cols.flatten()):
        angles = coord[:, None].double() * freqs
        parts += [angles.sin(), angles.cos()]
    code = torch.cat(parts, 1)
    return F.pad(code, (0, width - code.shape[1])).float()


class WordTokenizer:
    """Whitespace word tokenizer over a fixed vocabulary; id 0 is padding."""

    def __init__(self, words: tuple[str, ...], max_words: int):
        self.words = (PAD, *words)
        self.ids = {word: i for i, word in enumerate(self.words)}
        self.max_words = max_words

    def __len__(self) -> int:
        return len(self.words)

    def __call__(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """prompts -> (ids int64 [B, L], mask bool [B, L]), L = the longest prompt's word count."""
        if isinstance(prompts, str) or not len(prompts):
            raise ValueError(f"prompts: got {prompts!r}, expected a non-empty list of prompt strings")
        split = [prompt.lower().split() for prompt in prompts]
        for prompt, words in zip(prompts, split):
            if not words:
                raise ValueError(f"prompts: got an empty prompt {prompt!r}, expected at least one word")
            unknown = [w for w in dict.fromkeys(words) if w not in self.ids]
            if unknown:
                raise ValueError(
                    f"unknown word(s) {', '.join(repr(w) for w in unknown)} in prompt {prompt!r}; "
                    f"the tiny model knows: {' '.join(self.words[1:])}"
                )
            if len(words) > self.max_words:
                raise ValueError(f"prompt {prompt!r} has {len(words)} words, expected at most {self.max_words}")
        length = max(len(words) for words in split)
        ids = torch.zeros(len(split), length, dtype=torch.long)
        for row, words in enumerate(split):
            ids[row, : len(words)] = torch.tensor([self.ids[w] for w in words])
        return ids, ids != 0


class RelativePositionBias(nn.Module):
    """Learned per-head attention bias between image tokens by their grid offset (dy, dx), as in Swin.

    Initialised to -slope_h * distance (a 2D ALiBi): head 0 starts global (slope 0), the others
    increasingly local, so completing a shape from its neighbours is easy from the first step.
    Attention to and from prompt tokens gets no bias.
    """

    def __init__(self, grid: int, num_heads: int, max_slope: float = 2.0):
        super().__init__()
        span = 2 * grid - 1
        offsets = torch.arange(span, dtype=torch.float32) - (grid - 1)
        distance = (offsets[:, None] ** 2 + offsets[None, :] ** 2).sqrt()  # [span, span]
        slopes = torch.tensor([0.0] + [max_slope * 2.0 ** (h + 1 - num_heads) for h in range(1, num_heads)])
        self.table = nn.Parameter(-slopes[:, None, None] * distance)  # [H, span, span]
        rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        rows, cols = rows.flatten(), cols.flatten()
        index = (rows[:, None] - rows[None, :] + grid - 1) * span + (cols[:, None] - cols[None, :] + grid - 1)
        self.register_buffer("index", index, persistent=False)  # [N, N] into the flattened table

    def forward(self, prompt_length: int) -> torch.Tensor:
        """[H, L + N, L + N] additive attention bias for a sequence of L prompt then N image tokens."""
        image = self.table.flatten(1)[:, self.index]
        return F.pad(image, (prompt_length, 0, prompt_length, 0))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: bidirectional self-attention (padding masked, optionally with a
    relative position bias over image tokens) + GELU MLP."""

    def __init__(self, width: int, num_heads: int, mlp_ratio: float, grid: int | None):
        super().__init__()
        self.num_heads = num_heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.position_bias = RelativePositionBias(grid, num_heads) if grid else None
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor, padding: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """x [B, L + N, D] (prompt then image tokens); padding [B, 1, 1, L + N] additive (-inf = pad)."""
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        bias = padding if self.position_bias is None else padding + self.position_bias(prompt_length).to(x.dtype)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyMAR(nn.Module):
    """Tiny text-conditional MAR over pixel patches; implements margrpo.models.base.MARBackbone."""

    def __init__(self, config: TinyMARConfig | None = None):
        super().__init__()
        self.config = config = config or TinyMARConfig()
        self.num_tokens, self.token_channels = config.num_tokens, config.token_channels
        self.tokenizer = WordTokenizer(tuple(dict.fromkeys([*VOCABULARY, *NEGATIVE_PROMPT.split()])), config.max_prompt_words)
        self.word_embed = nn.Embedding(len(self.tokenizer), config.width)
        self.prompt_pos = nn.Parameter(torch.zeros(config.max_prompt_words, config.width))
        self.token_embed = nn.Linear(self.token_channels, config.width)
        self.mask_token = nn.Parameter(torch.zeros(config.width))
        self.image_pos = nn.Parameter(torch.zeros(self.num_tokens, config.width))
        bias_grid = config.grid if config.relative_position_bias else None
        self.blocks = nn.ModuleList(Block(config.width, config.num_heads, config.mlp_ratio, bias_grid) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self._init_weights()
        # created after the init above: the head keeps its own (adaLN-Zero) initialisation
        self.head = SimpleMLPAdaLN(self.token_channels, config.head_width, self.token_channels, config.width, config.head_depth)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        for param in (self.word_embed.weight, self.prompt_pos, self.mask_token):
            nn.init.normal_(param, std=0.02)
        # image positions start as 2D sin-cos (as in MAE): neighbouring patches start out similar,
        # which the model would otherwise have to discover from data
        with torch.no_grad():
            self.image_pos.copy_(sincos_2d(self.config.grid, self.config.width))

    # ------------------------------------------------------------------ MARBackbone protocol
    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        """Prompts -> word embeddings + prompt positions [B, L, D] and a padding mask [B, L]."""
        ids, mask = self.tokenizer(prompts)
        ids, mask = ids.to(self.prompt_pos.device), mask.to(self.prompt_pos.device)
        return PromptBatch(self.word_embed(ids) + self.prompt_pos[: ids.shape[1]], mask)

    def negative_prompt(self) -> str:
        """The unconditional prompt of CFG (also the dropped-prompt text in pretraining)."""
        return NEGATIVE_PROMPT

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        """canvas [B, N, C] (read where known), known bool [B, N] -> z [B, N, width]. Every position
        is attended (unknown ones as the mask token), so known_count is not needed."""
        batch = len(prompts)
        if canvas.shape != (batch, self.num_tokens, self.token_channels):
            raise ValueError(f"canvas: got shape {tuple(canvas.shape)}, expected [{batch}, {self.num_tokens}, {self.token_channels}]")
        if known.shape != (batch, self.num_tokens) or known.dtype != torch.bool:
            raise ValueError(f"known: got {known.dtype} {tuple(known.shape)}, expected bool [{batch}, {self.num_tokens}]")
        dtype = self.token_embed.weight.dtype
        image = torch.where(known[..., None], self.token_embed(canvas.to(dtype)), self.mask_token) + self.image_pos
        x = torch.cat([prompts.embeds.to(dtype), image], 1)
        prompt_length = prompts.embeds.shape[1]
        attend = torch.cat([prompts.mask, known.new_ones(batch, self.num_tokens)], 1)[:, None, None, :]
        padding = torch.zeros(attend.shape, dtype=dtype, device=x.device).masked_fill(~attend, float("-inf"))
        for block in self.blocks:
            x = block(x, padding, prompt_length)
        return self.norm(x[:, prompt_length:])

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, N, C] in [-1, 1] -> images float [B, 3, H, W] in [0, 1]."""
        size, patch, grid = self.config.image_size, self.config.patch_size, self.config.grid
        x = tokens.reshape(-1, grid, grid, 3, patch, patch).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(-1, 3, size, size).add(1).div(2).clamp(0, 1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every parameter outside the diffusion head (frozen during GRPO)."""
        head = {id(p) for p in self.head.parameters()}
        return [p for p in self.parameters() if id(p) not in head]

    # ------------------------------------------------------------------ data and sampling
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, H, W] in [0, 1] -> tokens [B, N, C] in [-1, 1] (inverse of decode)."""
        size, patch, grid = self.config.image_size, self.config.patch_size, self.config.grid
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, size, size):
            raise ValueError(f"images: got shape {tuple(images.shape)}, expected [B, 3, {size}, {size}]")
        x = images.reshape(-1, 3, grid, patch, grid, patch).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(-1, self.num_tokens, self.token_channels) * 2 - 1

    def make_sampler(self, num_steps: int | None = None) -> DDPMSampler:
        """The head's DDPM sampler: MAR's schedule (IDDPM respacing of 1000 training steps, eps
        prediction, fixed-large variance), with the predicted clean token clipped to the pixel range
        [-1, 1] (at the noisiest steps an eps error is amplified by 1 / sqrt(alpha_bar) ~ 600)."""
        return DDPMSampler(
            num_steps or self.config.diffusion_steps,
            beta_schedule=self.config.noise_schedule,
            spacing="iddpm",
            prediction_type="epsilon",
            variance_type="fixed_large",
            clip_sample=1.0,
        )

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        """Write `path`/model.safetensors and `path`/config.json."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
        (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "TinyMAR":
        """Rebuild from `path`/config.json and load `path`/model.safetensors strictly.

        A checkpoint that does not fit the config raises ValueError listing missing and unexpected
        keys and every shape mismatch."""
        path = Path(path)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"tiny MAR checkpoint: {path / name} not found (expected a directory with "
                    f"{CONFIG_FILE} and {WEIGHTS_FILE}, as written by `margrpo pretrain`, "
                    "`margrpo export` or `margrpo init-model shapes-tiny-random`)"
                )
        fields = json.loads((path / CONFIG_FILE).read_text())
        known = {f.name for f in dataclasses.fields(TinyMARConfig)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"{path / CONFIG_FILE}: unknown key(s) {unknown}; expected some of {sorted(known)}")
        model = cls(TinyMARConfig(**fields))
        model.load_weights(load_file(str(path / WEIGHTS_FILE), device=str(map_location)))
        return model.to(map_location)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load a state dict, first checking that its keys and shapes match this model exactly."""
        expected = self.state_dict()
        problems = []
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing:
            problems.append(f"missing keys {missing}")
        if unexpected:
            problems.append(f"unexpected keys {unexpected}")
        wrong = [
            f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(v.shape)}"
            for k, v in expected.items()
            if k in state and state[k].shape != v.shape
        ]
        if wrong:
            problems.append("shape mismatches: " + "; ".join(wrong))
        if problems:
            raise ValueError("tiny MAR checkpoint does not fit the model: " + " | ".join(problems))
        self.load_state_dict(state, strict=True)


def load(checkpoint: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> TinyMAR:
    """The loader of `backbone.name: tiny` (margrpo.models.registry): TinyMAR.load on `device`, cast to `dtype`."""
    return TinyMAR.load(checkpoint, map_location=device).to(dtype)
