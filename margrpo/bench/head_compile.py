"""Does the fused multi-seed denoise loop compile end to end, and does compiling it beat compiling the
reference loop? (issue 26, item 3)

Two parts, per case (a head size, K seed trajectories, CFG, T diffusion steps, N tokens):

  explain  torch._dynamo.explain of the whole T-step loop: the fused path (multi_seed_denoise: the
           run_chains loop, sampler steps, the margrpo custom ops) and the eager reference loop
           (margrpo.heads.upstream.eager_multi_seed_denoise): graphs, graph breaks and their reasons
  time     five methods, interleaved round by round in a shuffled order (margrpo.bench.timing):
             eager          the reference loop: one chain per trajectory, the official head forward
                            per (trajectory, step), modulation recomputed inside every call
             eager+compile  torch.compile of that whole reference loop (dynamic=False)
             fused          multi_seed_denoise: K + 1 chains batched, modulation once per (token, step)
             fused+compile  torch.compile(fullgraph=True) of multi_seed_denoise (no graph break allowed)
             fused+compile_head  multi_seed_denoise(..., compiled=True): the loop eager, each step's
                            head output one compiled graph (what a rollout runs under
                            rollout.compile_head, the default on CUDA)
           p20 / p50 / p80 and min ms per call (compilation excluded: warm-up calls), the speedup over
           eager as the median [p20, p80] of the per-round paired ratios, and max |x0 - eager x0| /
           max |eager x0| of each method as a sanity check.

Random weights at the real sizes (nova: NOVA-0.6B's mlp_d3w1280 head, Dz 1024, K 3, CFG 5; tiny: the
ShapesWorld head, width 128, depth 3, K 3, no CFG, as configs/shapes-tiny.yaml samples).

    python -m margrpo.bench.head_compile --device cpu --json out.json
    margrpo bench head-compile --cases nova --steps 10 --tokens 32 --explain-only
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from margrpo.bench.compiles import warn_if_compiled
from margrpo.bench.machine import JsonReport, header, split_choices
from margrpo.bench.timing import interleave

METHODS = ("eager", "eager+compile", "fused", "fused+compile", "fused+compile_head")
CASES = ("nova", "tiny", "nova-flow")
TIMED_CASES = ("nova", "tiny")
_STARTED = time.perf_counter()


@dataclass
class Setup:
    head: torch.nn.Module
    sampler: object
    z: torch.Tensor
    noise: torch.Tensor
    num_seeds: int
    cfg: object
    record: tuple[int, ...]


def build_case(name: str, tokens: int, steps: int, device: torch.device) -> Setup:
    """The head (random weights, frozen), its sampler, z ([2N, Dz] with CFG) and noise [T+1, K+1, N, C]."""
    from margrpo.bench.denoise import CASES as DENOISE_CASES
    from margrpo.bench.denoise import build, make_inputs, make_sampler
    from margrpo.diffusion import FlowSDESampler
    from margrpo.models.tiny import TinyMAR, TinyMARConfig

    record = tuple(sorted({1, steps // 2}))  # two recorded steps, as a rollout's recorded mask step has
    if name in ("nova", "nova-flow"):
        case = DENOISE_CASES["nova-d3w1280"]
        head = build(case, device, torch.float32)
        sampler = make_sampler(case, steps) if name == "nova" else FlowSDESampler(steps)
        z, noise = make_inputs(head, case, tokens, steps, device)
        return Setup(head, sampler, z, noise, case.num_seeds, case.guidance, record)
    if name != "tiny":
        raise ValueError(f"case: got {name!r}, expected one of {', '.join(CASES)}")
    torch.manual_seed(0)
    model = TinyMAR(TinyMARConfig())
    head = model.head.to(device).eval()
    for p in head.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(tokens, head.z_channels, generator=g).to(device)
    noise = torch.randn(steps + 1, 4, tokens, head.in_channels, generator=g).to(device)
    return Setup(head, model.make_sampler(steps), z, noise, 3, None, record)


def method_table(s: Setup, names: tuple[str, ...]) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a zero-argument callable returning x0 [K+1, N, C]."""
    from margrpo.heads import multi_seed_denoise
    from margrpo.heads.upstream import eager_multi_seed_denoise

    def eager(z, noise):
        return eager_multi_seed_denoise(s.head, z, s.sampler, s.num_seeds, noise, cfg=s.cfg, record_steps=s.record).x0

    def fused(z, noise):
        return multi_seed_denoise(s.head, z, s.sampler, s.num_seeds, cfg=s.cfg, noise=noise, record_steps=s.record).x0

    def fused_compile_head(z, noise):
        return multi_seed_denoise(s.head, z, s.sampler, s.num_seeds, cfg=s.cfg, noise=noise, record_steps=s.record, compiled=True).x0

    table: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "eager": eager,
        "fused": fused,
        "fused+compile_head": fused_compile_head,
    }
    if "eager+compile" in names:
        table["eager+compile"] = torch.compile(eager, dynamic=False)
    if "fused+compile" in names:
        table["fused+compile"] = torch.compile(fused, dynamic=False, fullgraph=True)
    return {name: (lambda fn=table[name]: fn(s.z, s.noise)) for name in names}


def explain(s: Setup) -> dict[str, dict]:
    """Graphs, graph breaks and their reasons (counted) of the fused and the eager reference loop."""
    from margrpo.heads import multi_seed_denoise
    from margrpo.heads.upstream import eager_multi_seed_denoise

    loops = {
        "fused": lambda z, noise: multi_seed_denoise(s.head, z, s.sampler, s.num_seeds, cfg=s.cfg, noise=noise, record_steps=s.record).x0,
        "eager": lambda z, noise: eager_multi_seed_denoise(s.head, z, s.sampler, s.num_seeds, noise, cfg=s.cfg, record_steps=s.record).x0,
    }
    found = {}
    for name, loop in loops.items():
        torch._dynamo.reset()
        with torch.no_grad():
            out = torch._dynamo.explain(loop)(s.z, s.noise)
        reasons: collections.Counter[str] = collections.Counter()
        for item in out.break_reasons:
            first = str(item.reason).strip().splitlines()[0][:160]
            where = item.user_stack[-1] if item.user_stack else None
            place = f"{where.filename.split('margrpo/', 1)[-1]}:{where.lineno}" if where is not None else "?"
            reasons[f"{first} @ {place}"] += 1
        found[name] = {"graphs": out.graph_count, "graph_breaks": out.graph_break_count, "ops": out.op_count, "reasons": dict(reasons)}
    torch._dynamo.reset()
    return found


def time_case(s: Setup, names: tuple[str, ...], device: torch.device, rounds: int, clock) -> dict[str, dict]:
    fns = method_table(s, names)
    with torch.no_grad():
        compile_s = {}
        for name, fn in fns.items():  # warm-up (compilation) outside the timing
            start = time.perf_counter()
            fn()
            compile_s[name] = time.perf_counter() - start
        reference = fns["eager"]() if "eager" in fns else None
        timed = interleave(fns, device, min_time_s=0.0, warmup=1, min_rounds=rounds, max_rounds=rounds, clock=clock)
        for line in warn_if_compiled(timed.compiles, "[head-compile]"):
            print(line, flush=True)
        rows = {}
        for name, fn in fns.items():
            st = timed.stats(name)
            row = {"p20_ms": st.p20, "p50_ms": st.p50, "p80_ms": st.p80, "min_ms": st.min, "rounds": st.n, "first_call_s": compile_s[name]}
            row["compiles_while_timed"] = timed.compiles[name]
            if reference is not None:
                ratio = timed.ratio("eager", name)
                row.update(speedup_vs_eager=ratio.p50, speedup_p20=ratio.p20, speedup_p80=ratio.p80)
                row["rel_diff_vs_eager"] = float((fn() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
            rows[name] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo bench head-compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cases", default="nova,tiny", help=f"comma-separated, of {', '.join(CASES)} (nova-flow: explain only)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--tokens", type=int, default=32, help="tokens N per call (a NOVA mask step reveals ~16 of 1024)")
    parser.add_argument("--steps", type=int, default=10, help="diffusion steps T per chain (NOVA samples 25)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave as is)")
    parser.add_argument("--clock", choices=("wall", "thread"), default="thread", help="CPU: perf_counter or this thread's CPU time")
    parser.add_argument("--explain-only", action="store_true")
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads and device.type == "cpu":
        torch.set_num_threads(args.threads)
    cases = split_choices(args.cases, CASES, "--cases")
    names = split_choices(args.methods, METHODS, "--methods")
    clock = time.thread_time if args.clock == "thread" and device.type == "cpu" else None
    report = JsonReport(args.json, device, tokens=args.tokens, steps=args.steps, threads=torch.get_num_threads(), clock=args.clock)
    print(header(report.head["machine"]))
    explained: list[dict] = []  # beside the timed rows (summarize.py tabulates "rows")
    for case in cases:
        s = build_case(case, args.tokens, args.steps, device)
        print(f"[{time.perf_counter() - _STARTED:.0f}s] {case}: N={args.tokens} T={args.steps} K={s.num_seeds} cfg={s.cfg}", flush=True)
        if not args.no_explain:
            found = explain(s)
            for loop, facts in found.items():
                print(f"  explain {loop}: {facts['graphs']} graphs, {facts['graph_breaks']} graph breaks, {facts['ops']} ops")
                for reason, count in facts["reasons"].items():
                    print(f"    {count}x {reason}")
                explained.append({"case": case, "loop": loop, **facts})
                report.set("explain", explained)
        if args.explain_only or case not in TIMED_CASES:
            continue
        rows = time_case(s, names, device, args.rounds, clock)
        print(f"  {'method':<14} {'p20 ms':>9} {'p50 ms':>9} {'p80 ms':>9} {'first s':>8} {'vs eager [p20, p80]':>22} {'rel diff':>9}")
        for name, row in rows.items():
            speed = (
                f"{row['speedup_vs_eager']:.2f}x [{row['speedup_p20']:.2f}, {row['speedup_p80']:.2f}]" if "speedup_vs_eager" in row else ""
            )
            diff = f"{row['rel_diff_vs_eager']:.1e}" if "rel_diff_vs_eager" in row else ""
            cells = f"{row['p20_ms']:9.2f} {row['p50_ms']:9.2f} {row['p80_ms']:9.2f} {row['first_call_s']:8.1f}"
            print(f"  {name:<14} {cells} {speed:>22} {diff:>9}")
            report.add({"case": case, "method": name, "tokens": args.tokens, "steps": args.steps, **row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
