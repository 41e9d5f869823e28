"""Benchmark of multi-seed denoising: the fused path against the reference code's approach.

For each case (a real head size, K seed trajectories, CFG) it times one full denoising chain of the
main trajectory and K seed trajectories for `tokens` tokens over `steps` diffusion steps:
  fused    margrpo.heads.multi_seed_denoise: one batched pass, modulation once per (token, step)
           shared by all trajectories, both CFG halves reading one copy of x, fused adaLN kernels
  eager    one chain per trajectory, the official head forward per (trajectory, step): the
           modulation is recomputed inside every call (how the public reference code samples)
  compile  torch.compile of a restructured reference: every trajectory and CFG half batched into one
           official head call per step (z repeated K+1 times, modulation recomputed per copy)
  fused+compile_head  the fused path with each step's head output compiled (multi_seed_denoise(...,
           compiled=True): what a rollout runs under rollout.compile_head, the default on CUDA)
Random weights at the real sizes (speed does not depend on the values). Time: p20 / p50 / p80 and
min of `repeats` rounds after one warm-up, the methods interleaved in each round in a shuffled order
(margrpo.bench.timing; perf_counter on CPU, CUDA events on CUDA); the speedup over eager is the
median [p20, p80] of the per-round paired ratios. Also reports the largest |x0 - eager x0| relative
to the largest |eager x0| as a sanity check.

    python -m margrpo.bench.denoise --device cpu --tokens 32 --steps 4 --json out.json
    margrpo bench denoise --cases harmon-mar_h --methods fused,eager
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from margrpo.bench.compiles import warn_if_compiled
from margrpo.bench.machine import JsonReport, header, split_choices
from margrpo.bench.timing import interleave
from margrpo.diffusion import DDPMSampler, mar_sampler
from margrpo.heads import Guidance, mar_head, multi_seed_denoise, nova_head
from margrpo.heads.upstream import eager_multi_seed_denoise

_STARTED = time.perf_counter()  # progress lines say when (the GPU script's limits)


@dataclass(frozen=True)
class Case:
    family: str  # "nova" or "harmon"
    size: str
    z_channels: int
    num_seeds: int
    guidance: Guidance


CASES: dict[str, Case] = {
    "nova-d6w1024": Case("nova", "d6w1024", 1024, 3, Guidance(5.0)),
    "nova-d3w1280": Case("nova", "d3w1280", 1024, 3, Guidance(5.0)),
    "harmon-mar_h": Case("harmon", "mar_h", 1280, 5, Guidance(3.0, channels="eps")),
}
METHODS = ("fused", "eager", "compile", "fused+compile_head")
TOKEN_CHANNELS = 16


@dataclass
class Row:
    case: str
    method: str
    tokens: int
    steps: int
    num_seeds: int
    p20_ms: float
    p50_ms: float
    p80_ms: float
    min_ms: float
    rounds: int
    speedup_vs_eager: float | None  # median over rounds of eager's time / this time, in the same round
    speedup_p20: float | None
    speedup_p80: float | None
    rel_diff_vs_eager: float | None  # max |x0 - eager x0| / max |eager x0|


# ---------------------------------------------------------------- setup
def build(case: Case, device: torch.device, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """The head at its real size with random weights (meta init, then N(0, 1/fan_in) fills: fast)."""
    with torch.device("meta"):
        head = nova_head(case.size, cond_dim=case.z_channels) if case.family == "nova" else mar_head(case.size)
    head = head.to_empty(device=device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if p.dim() == 1:
                base = 1.0 if name.endswith("norm2.weight") or name.endswith("in_ln.weight") else 0.0
                p.copy_(base + 0.02 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            p.requires_grad_(False)
    return head.to(dtype).eval()


def make_sampler(case: Case, steps: int):
    return DDPMSampler(steps, beta_schedule="squaredcos_cap_v2", spacing="trailing") if case.family == "nova" else mar_sampler(steps)


def make_inputs(head: nn.Module, case: Case, tokens: int, steps: int, device: torch.device, seed: int = 1):
    """z [2N, Dz] ([cond; uncond]) and noise [steps + 1, K + 1, N, C], fp32, random."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn(2 * tokens, head.z_channels, generator=g).to(device)
    noise = torch.randn(steps + 1, case.num_seeds + 1, tokens, TOKEN_CHANNELS, generator=g).to(device)
    return z, noise


def batched_reference(
    forward: Callable, head: nn.Module, z: torch.Tensor, sampler, num_seeds: int, noise: torch.Tensor, cfg: Guidance
) -> torch.Tensor:
    """Every trajectory and CFG half in one official head call per step (z copied K+1 times)."""
    tokens, channels = noise.shape[2], noise.shape[3]
    z_all = z.repeat(num_seeds + 1, 1)  # rows ordered (trajectory, half, token)
    x = noise[0]
    with torch.no_grad():
        for i in range(sampler.num_steps):
            times = torch.full((z_all.shape[0],), float(sampler.model_time(i)), device=z.device)
            x_all = x[:, None].expand(num_seeds + 1, 2, tokens, channels).reshape(-1, channels)
            out = forward(x_all, times, z_all).view(num_seeds + 1, 2, tokens, -1)
            guided = cfg.combine(out[:, 0], out[:, 1], head.in_channels).float()
            x = sampler.step(guided, x, i, noise[i + 1]).x_prev
    return x


def methods(head: nn.Module, case: Case, sampler, z, noise, names: tuple[str, ...]) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a zero-argument callable returning x0 [K+1, N, C]."""
    cfg, k = case.guidance, case.num_seeds
    table: dict[str, Callable[[], torch.Tensor]] = {
        "fused": lambda: multi_seed_denoise(head, z, sampler, k, cfg=cfg, noise=noise).x0,
        "eager": lambda: eager_multi_seed_denoise(head, z, sampler, k, noise, cfg=cfg).x0,
        "fused+compile_head": lambda: multi_seed_denoise(head, z, sampler, k, cfg=cfg, noise=noise, compiled=True).x0,
    }
    if "compile" in names:
        compiled = torch.compile(head.forward, dynamic=False)
        table["compile"] = lambda: batched_reference(compiled, head, z, sampler, k, noise, cfg)
    return {name: table[name] for name in names}


def run(
    cases: tuple[str, ...],
    names: tuple[str, ...],
    device: torch.device,
    tokens: int,
    steps: int,
    repeats: int,
    dtype: torch.dtype,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Time the methods of every case; on_row(row) is called as each row is measured."""
    rows = []
    for case_name in cases:
        case = CASES[case_name]
        head = build(case, device, dtype)
        sampler = make_sampler(case, steps)
        z, noise = make_inputs(head, case, tokens, steps, device)
        fns = methods(head, case, sampler, z, noise, names)
        reference = fns["eager"]() if "eager" in fns else None
        timed = interleave(fns, device, min_time_s=0.0, warmup=1, min_rounds=repeats, max_rounds=repeats)
        for line in warn_if_compiled(timed.compiles, f"[denoise] {case_name}"):
            print(line, flush=True)
        for name in timed.times:
            diff = None if reference is None else float((fns[name]() - reference).abs().max() / reference.abs().max())
            st = timed.stats(name)
            ratio = timed.ratio("eager", name) if "eager" in timed.times else None
            rows.append(
                Row(
                    case_name,
                    name,
                    tokens,
                    steps,
                    case.num_seeds,
                    st.p20,
                    st.p50,
                    st.p80,
                    st.min,
                    st.n,
                    ratio and ratio.p50,
                    ratio and ratio.p20,
                    ratio and ratio.p80,
                    diff,
                )
            )
            if on_row:
                on_row(rows[-1])
        del head
    return rows


def format_table(rows: list[Row]) -> str:
    lines = [
        f"{'case':<14} {'method':<8} {'tokens':>6} {'steps':>5} {'K':>2} {'rounds':>6} {'p50 ms':>10} {'p20 ms':>10} "
        f"{'p80 ms':>10} {'min ms':>10} {'x eager p50 [p20, p80]':>24} {'rel dx0':>9}"
    ]
    for r in rows:
        speed = f"{r.speedup_vs_eager:.2f} [{r.speedup_p20:.2f}, {r.speedup_p80:.2f}]" if r.speedup_vs_eager is not None else "-"
        diff = f"{r.rel_diff_vs_eager:.1e}" if r.rel_diff_vs_eager is not None else "-"
        lines.append(
            f"{r.case:<14} {r.method:<8} {r.tokens:>6} {r.steps:>5} {r.num_seeds:>2} {r.rounds:>6} {r.p50_ms:>10.1f} "
            f"{r.p20_ms:>10.1f} {r.p80_ms:>10.1f} {r.min_ms:>10.1f} {speed:>24} {diff:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo bench denoise", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--tokens", type=int, help="tokens per chain (default: 1024 on CUDA, 32 on CPU)")
    parser.add_argument("--steps", type=int, help="diffusion steps T (default: 25 on CUDA, 4 on CPU)")
    parser.add_argument("--repeats", type=int, help="timed rounds after one warm-up (default: 10 on CUDA, 5 on CPU)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="head dtype (default: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    tokens = args.tokens or (1024 if gpu else 32)
    steps = args.steps or (25 if gpu else 4)
    repeats = args.repeats or (10 if gpu else 5)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if gpu else torch.float32)
    report = JsonReport(args.json, device, dtype=str(dtype))
    print(header(report.head["machine"]), flush=True)

    def on_row(row: Row) -> None:
        report.add(asdict(row))
        print(
            f"[denoise] {row.case} {row.method}: p50 {row.p50_ms:.2f} ms at {time.perf_counter() - _STARTED:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    rows = run(
        split_choices(args.cases, tuple(CASES), "cases"),
        split_choices(args.methods, METHODS, "methods"),
        device,
        tokens,
        steps,
        repeats,
        dtype,
        on_row=on_row,
    )
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
