"""Benchmark of a whole MAR rollout: images/s of margrpo.rollout.generate against the reference code's way.

Every path runs the same backbone, head, sampler, mask schedule, K seed trajectories, CFG and
recorded steps; they differ in how the head work is organised:
  fused      margrpo.rollout.generate: at each mask step only the revealed tokens, all K + 1
             trajectories in one batched pass with the modulation shared (heads.multi_seed_denoise)
  per-seed   the same tokens, one chain per trajectory through the official head forward (the
             modulation recomputed in every call): isolates the multi-seed fusion
  reference  the reference code's approach: one chain per trajectory over ALL N tokens at every
             mask step (official forward), of which the revealed ones are kept
Models:
  tiny         margrpo.models.TinyMAR (the shipped checkpoint when present, else random init) and its
               own sampler
  nova, harmon the real head at random init (margrpo.bench.denoise.build: NOVA d6w1024 K=3 CFG 5 on all
               channels; Harmon mar_h K=5 CFG 3 on eps) behind a stand-in backbone of one linear layer:
               the transformer costs the same S forward passes in every path, so it is left out and
               the table isolates the work the paths do differently.
Time: p20 / p50 / p80 and min of `repeats` rounds after one warm-up (a whole rollout, or a short one
of --warmup-mask-steps), the paths interleaved in each round in a shuffled order that the JSON records
(margrpo.bench.timing; perf_counter on CPU, CUDA events on CUDA); the speedup over the reference is the
median [p20, p80] of the per-round paired ratios. Memory (margrpo.bench.memory) is that of the untimed
warm-up call when it is a whole rollout (no extra rollout is run for it); with --warmup-mask-steps there
is none.
The reference path does about S times the head work of the others: the defaults on CUDA (B=2,
N=1024, S=64, T=25, one timed run) take an estimated 1-2 minutes in all on an H200, mostly the
Harmon reference; shorten with --paths or --mask-steps.

    python -m margrpo.bench.rollout --models tiny --batch 4
    margrpo bench rollout --models nova,harmon --device cuda --batch 8 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from margrpo.bench import memory
from margrpo.bench.compiles import warn_if_compiled
from margrpo.bench.denoise import CASES, build, make_sampler
from margrpo.bench.machine import JsonReport, header, load_average, split_choices
from margrpo.bench.timing import Timed, interleave
from margrpo.heads.upstream import eager_multi_seed_denoise
from margrpo.models.base import PromptBatch
from margrpo.rollout import RolloutConfig, effective_steps, generate, group_seeds, mask_schedule
from margrpo.rollout.guidance import forward_rows, guidance_for, head_condition, prompt_rows

MODELS = ("tiny", "nova", "harmon")
PATHS = ("fused", "per-seed", "reference")

_STARTED = time.perf_counter()  # progress lines say when (the GPU script's limits)


class StandInBackbone(nn.Module):
    """A MARBackbone whose z is one linear map of the canvas plus position and prompt embeddings, layer
    normalised: negligible next to the head, so a benchmark of the rollout measures the sampling work.
    Its sampler is the head's (`sampler_factory(num_steps)`)."""

    def __init__(
        self, head: nn.Module, num_tokens: int, token_channels: int, sampler_factory: Callable[[int | None], object], vocab: int = 1024
    ):
        super().__init__()
        width = head.z_channels
        self.num_tokens, self.token_channels, self.vocab = num_tokens, token_channels, vocab
        self._sampler_factory = sampler_factory  # the head's own sampler, by number of steps
        self.word_embed = nn.Embedding(vocab, width)
        self.token_in = nn.Linear(token_channels, width)
        self.mask_embed = nn.Parameter(torch.randn(width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(num_tokens, width) * 0.02)
        self.head = head

    def encode_prompts(self, prompts: list[str]) -> PromptBatch:
        words = [p.split() or [""] for p in prompts]
        length = max(len(w) for w in words)
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        mask = torch.zeros(len(prompts), length, dtype=torch.bool)
        for row, ws in enumerate(words):
            for col, w in enumerate(ws):
                ids[row, col], mask[row, col] = zlib.crc32(w.encode()) % self.vocab, True
        device = self.pos_embed.device
        return PromptBatch(self.word_embed(ids.to(device)), mask.to(device))

    def negative_prompt(self) -> str:
        return ""

    def forward_z(self, prompts: PromptBatch, canvas: torch.Tensor, known: torch.Tensor, known_count: int | None = None) -> torch.Tensor:
        text = (prompts.embeds * prompts.mask[..., None]).sum(1) / prompts.mask.sum(1, keepdim=True).clamp(min=1)
        tokens = torch.where(known[..., None], self.token_in(canvas), self.mask_embed)
        # normalised, as a transformer's final norm leaves z: a random head's wild tokens stay out of it
        return nn.functional.layer_norm(tokens + self.pos_embed + text[:, None], tokens.shape[-1:])

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """A [B, 3, 1, N] strip of the first 3 channels (any token count; nothing reads its pixels)."""
        return tokens[..., :3].transpose(1, 2).unsqueeze(2).sigmoid()

    def make_sampler(self, num_steps: int | None = None):
        return self._sampler_factory(num_steps)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("head.")]


@dataclass
class Setup:
    backbone: nn.Module
    sampler: object
    config: RolloutConfig
    prompts: tuple[str, ...]  # cycled over the batch


def make_setup(model: str, device: torch.device, dtype: torch.dtype, tokens: int, mask_steps: int, diffusion_steps: int) -> Setup:
    """The backbone, sampler and rollout config of a benchmark model."""
    record = dict(record_mask_steps=min(12, mask_steps - 1), record_diffusion_steps=min(10, diffusion_steps - 1))
    if model == "tiny":
        from margrpo.models import BackboneConfig, load_backbone

        backbone = load_backbone(BackboneConfig(), device)  # the shipped shapes-tiny model
        config = RolloutConfig(num_mask_steps=mask_steps, schedule="harmon", cfg_scale=3.0, num_seeds=3, **record)
        prompts = ("a red square", "two blue circles", "a green triangle left of a yellow circle")
        return Setup(backbone, backbone.make_sampler(diffusion_steps), config, prompts)
    case = CASES["nova-d6w1024" if model == "nova" else "harmon-mar_h"]
    backbone = StandInBackbone(build(case, device, dtype), tokens, 16, lambda steps: make_sampler(case, steps or diffusion_steps)).to(
        device
    )
    backbone.head.to(dtype)
    config = RolloutConfig(
        num_mask_steps=mask_steps,
        schedule=case.family,
        cfg_scale=case.guidance.scale,
        cfg_channels=case.guidance.channels,
        num_seeds=case.num_seeds,
        **record,
    )
    return Setup(backbone, backbone.make_sampler(diffusion_steps), config, ("a photo of a cat", "a red car on a road"))


@torch.no_grad()
def per_seed_rollout(
    backbone, prompts: list[str], config: RolloutConfig, sampler, all_tokens: bool, generator: torch.Generator
) -> torch.Tensor:
    """The rollout with one eager chain per trajectory (margrpo.heads.upstream), over the revealed
    tokens or over all N tokens of every image at every mask step. -> images."""
    B, N, C, K = len(prompts), backbone.num_tokens, backbone.token_channels, config.num_seeds
    device = next(backbone.parameters()).device
    counts = mask_schedule(N, config.num_mask_steps, config.schedule)
    record_at = set(effective_steps(counts)[: config.record_mask_steps])
    record_steps = tuple(sampler.stochastic_steps()[: config.record_diffusion_steps])
    rows = prompt_rows(backbone, prompts, config)
    order = torch.stack([torch.randperm(N, generator=generator, device=device) for _ in range(B)])
    canvas = torch.zeros(B, N, C, device=device)
    known = torch.zeros(B, N, dtype=torch.bool, device=device)
    every = torch.arange(N, device=device).expand(B, N)
    start = 0
    for step in effective_steps(counts):
        n = counts[step]
        revealed = order[:, start : start + n]
        positions = every if all_tokens else revealed
        z = forward_rows(backbone, rows, canvas, known, start)
        noise = torch.randn(sampler.num_steps + 1, K + 1, positions.numel(), C, generator=generator, device=device)
        out = eager_multi_seed_denoise(
            backbone.head,
            head_condition(z, rows, positions),
            sampler,
            K,
            noise,
            cfg=guidance_for(config, config.cfg_scale_at(start + n, N)),
            record_steps=record_steps if step in record_at else (),
            temperature=config.temperature,
        )
        x0 = out.x0[0].reshape(B, -1, C).float()
        values = x0.gather(1, revealed[..., None].expand(-1, -1, C)) if all_tokens else x0
        canvas.scatter_(1, revealed[..., None].expand(-1, -1, C), values)
        known.scatter_(1, revealed, True)
        start += n
    return backbone.decode(canvas)


def path_functions(setup: Setup, batch: int, device: torch.device, config: RolloutConfig | None = None) -> dict[str, Callable[[], object]]:
    """path -> a zero-argument rollout of `batch` images (config: setup.config unless given)."""
    prompts = [setup.prompts[i % len(setup.prompts)] for i in range(batch)]
    seeds = group_seeds(0, 0, list(range(batch)), 1)
    generator = torch.Generator(device=device).manual_seed(0)
    b, c, s = setup.backbone, config or setup.config, setup.sampler
    return {
        "fused": lambda: generate(b, prompts, c, seeds, sampler=s).images,
        "per-seed": lambda: per_seed_rollout(b, prompts, c, s, all_tokens=False, generator=generator),
        "reference": lambda: per_seed_rollout(b, prompts, c, s, all_tokens=True, generator=generator),
    }


@dataclass
class Row:
    model: str
    path: str
    batch: int
    tokens: int
    mask_steps: int
    diffusion_steps: int
    num_seeds: int
    cfg_scale: float
    ms: float  # the median (= p50_ms), kept for readers of older reports
    images_per_s: float  # batch / the median
    speedup_vs_reference: float | None  # median over rounds of the reference's time / this time, same round
    p20_ms: float
    p50_ms: float
    p80_ms: float
    min_ms: float
    rounds: int
    speedup_p20: float | None
    speedup_p80: float | None
    mem_mb: float | None  # margrpo.bench.memory.method(device), of the warm-up rollout; None after a short one


def run(
    models: tuple[str, ...],
    paths: tuple[str, ...],
    device: torch.device,
    dtype: torch.dtype,
    batch: int,
    tokens: int,
    mask_steps: int,
    diffusion_steps: int,
    repeats: int,
    on_row: Callable[[Row], None] | None = None,
    warmup_mask_steps: int | None = None,
    groups: list[dict] | None = None,
) -> list[Row]:
    """Time the paths of every model; on_row(row) is called as each row is measured, and each model's
    rounds and interleaving order are appended to `groups`. The warm-up call of each path is a whole
    rollout (its memory measured), or one of warmup_mask_steps mask steps when given (every kernel runs
    in a few steps: the eager reference paths cost seconds per extra call on a GPU)."""
    rows = []
    for model in models:
        setup = make_setup(model, device, dtype, tokens, mask_steps, diffusion_steps)
        fns = {path: fn for path, fn in path_functions(setup, batch, device).items() if path in paths}
        mem: dict[str, float | None] = dict.fromkeys(fns)
        if warmup_mask_steps is None:
            mem = {path: memory.call_mb(Timed(fn), device) for path, fn in fns.items()}
        else:
            steps = max(2, min(warmup_mask_steps, mask_steps))
            short = dataclasses.replace(
                setup.config, num_mask_steps=steps, record_mask_steps=min(setup.config.record_mask_steps, steps - 1)
            )
            for path, warm in path_functions(setup, batch, device, short).items():
                if path in paths:
                    warm()
        timed = interleave(fns, device, min_time_s=0.0, warmup=0, min_rounds=repeats, max_rounds=repeats)
        if groups is not None:
            groups.append({"model": model, "rounds": len(timed.order), "order": timed.order, "compiles_while_timed": timed.compiles})
        for line in warn_if_compiled(timed.compiles, f"[rollout] {model}"):
            print(line, flush=True)
        for path in timed.times:
            st = timed.stats(path)
            ratio = timed.ratio("reference", path) if "reference" in timed.times else None
            rows.append(
                Row(
                    model,
                    path,
                    batch,
                    setup.backbone.num_tokens,
                    mask_steps,
                    setup.sampler.num_steps,
                    setup.config.num_seeds,
                    setup.config.cfg_scale,
                    st.p50,
                    batch / (st.p50 / 1e3),
                    ratio and ratio.p50,
                    st.p20,
                    st.p50,
                    st.p80,
                    st.min,
                    st.n,
                    ratio and ratio.p20,
                    ratio and ratio.p80,
                    mem[path],
                )
            )
            if on_row:
                on_row(rows[-1])
    return rows


def format_table(rows: list[Row]) -> str:
    """One line per (model, path): times (p50, p20, p80, min), images/s at the median, the speedup over
    the reference (paired per round) and the memory."""
    lines = [
        f"{'model':<7} {'path':<10} {'B':>3} {'N':>5} {'S':>3} {'T':>3} {'K':>2} {'cfg':>4} {'rounds':>6} "
        f"{'p50 ms':>10} {'p20 ms':>10} {'p80 ms':>10} {'min ms':>10} {'img/s':>9} {'x ref p50 [p20, p80]':>22} "
        f"{'MB':>9}"
    ]
    for r in rows:
        speed = f"{r.speedup_vs_reference:.2f} [{r.speedup_p20:.2f}, {r.speedup_p80:.2f}]" if r.speedup_vs_reference is not None else "-"
        mem = f"{r.mem_mb:.3g}" if r.mem_mb is not None else "-"
        lines.append(
            f"{r.model:<7} {r.path:<10} {r.batch:>3} {r.tokens:>5} {r.mask_steps:>3} {r.diffusion_steps:>3} "
            f"{r.num_seeds:>2} {r.cfg_scale:>4g} {r.rounds:>6} {r.p50_ms:>10.1f} {r.p20_ms:>10.1f} "
            f"{r.p80_ms:>10.1f} {r.min_ms:>10.1f} {r.images_per_s:>9.2f} {speed:>22} {mem:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo bench rollout", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", help="comma list of tiny, nova, harmon (default: all on CUDA, tiny on CPU)")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--batch", type=int, help="images per rollout (default: 2)")
    parser.add_argument("--tokens", type=int, help="tokens per image, nova/harmon (default: 1024 on CUDA, 64 on CPU)")
    parser.add_argument("--mask-steps", type=int, help="S (default: 64 on CUDA, 8 on CPU)")
    parser.add_argument("--diffusion-steps", type=int, help="T (default: 25 on CUDA, 4 on CPU)")
    parser.add_argument("--repeats", type=int, help="timed rollouts after one warm-up (default: 1)")
    parser.add_argument("--warmup-mask-steps", type=int, help="mask steps of the warm-up rollout of each path (default: a whole rollout)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="head dtype (default: bf16 on CUDA)")
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    batch = args.batch or 2
    models = args.models or (",".join(MODELS) if gpu else "tiny")
    tokens = args.tokens or (1024 if gpu else 64)
    mask_steps = args.mask_steps or (64 if gpu else 8)
    diffusion_steps = args.diffusion_steps or (25 if gpu else 4)
    repeats = args.repeats or 1
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if gpu else torch.float32)
    for name, value in (
        ("batch", batch),
        ("tokens", tokens),
        ("mask-steps", mask_steps),
        ("diffusion-steps", diffusion_steps),
        ("repeats", repeats),
    ):
        if value < 1 or (name in ("mask-steps", "diffusion-steps") and value < 2):
            raise SystemExit(f"--{name}: got {value}, expected a positive integer (>= 2 for step counts)")
    report = JsonReport(
        args.json,
        device,
        dtype=str(dtype),
        memory=memory.method(device),
        speedup="median [p20, p80] over rounds of the reference's time / the path's, same round",
    )
    print(f"{header(report.head['machine'])}\nmemory: {memory.method(device)}", flush=True)
    groups: list[dict] = []

    def on_row(row: Row) -> None:
        report.add(asdict(row))
        report.set("groups", groups)
        print(
            f"[rollout] {row.model} {row.path}: p50 {row.p50_ms:.1f} ms ({row.images_per_s:.2f} images/s) "
            f"at {time.perf_counter() - _STARTED:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    rows = run(
        split_choices(models, MODELS, "models"),
        split_choices(args.paths, PATHS, "paths"),
        device,
        dtype,
        batch,
        tokens,
        mask_steps,
        diffusion_steps,
        repeats,
        on_row=on_row,
        warmup_mask_steps=args.warmup_mask_steps,
        groups=groups,
    )
    report.set("load_average_end", load_average())
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
