"""Where one NOVA GRPO step's time and FLOPs go (issue 26, item 4): per phase, exclusive time and FLOPs
of one step of the fused path (Trainer.train_step with the reference code's algorithm, as
margrpo.bench.models.bench_nova runs it) and, optionally, of the reference-style step
(nova_reference_grpo_step), on the random-init NOVA-0.6B @512 (preset nova-0.6b-random: 1024 tokens,
real transformer and head sizes).

Phases are attributed by wrapping the calls a step makes (the innermost wrapped call owns its time and
FLOPs; what no wrapper covers is "other"):
  prompts             encode_prompts (Phi text encoder + NOVA's temporal transformer)
  rollout backbone    forward_z during the rollout (one per effective mask step, [cond; uncond] rows)
  rollout head        the diffusion head chains of the rollout (multi_seed_denoise / the reference's
                      eager chains), sampler arithmetic included
  decode              the SD VAE decoder
  reward              the reward (jpeg here)
  likelihood backbone forward_z of the policy in the update (with grad; "no grad" = rescoring)
  likelihood head     the head's recomputation of the recorded transitions (transitions_logprob)
  KL reference        forward_z and head of the frozen KL reference (no grad)
  backward            torch.autograd.backward
  optimizer           optimizer.step, gradient clipping, zero_grad
FLOPs: torch.utils.flop_counter.FlopCounterMode over the whole step (matmuls, convolutions and
attention; elementwise work counts 0). Time on CPU: thread CPU time (time.thread_time) with one torch
thread, so the load others put on a shared machine does not count (wall time is reported beside it);
on CUDA: wall time with a synchronisation at every phase boundary. MFU = FLOPs / (time x the stated
peak: one core on CPU, the card on CUDA; PEAK_GFLOPS).

Each path first runs one step on a short schedule (--warmup-mask-steps), untimed: a first step
compiles (Triton kernels; on CUDA the head's torch.compile graphs) and would report compile time as
its phases'. The JIT compiles left inside the profiled step are reported beside it. --kernels N
traces one more step with torch.profiler, uninstrumented (margrpo.bench.kernel_profile): the top N
kernels by device time, the launches, and how much of the step the GPU was busy.

    python -m margrpo.bench.nova_profile --mask-steps 4 --record-mask-steps 2 --kernels 30 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

PHASES = (
    "prompts",
    "rollout backbone",
    "rollout head",
    "decode",
    "reward",
    "likelihood backbone (grad)",
    "likelihood backbone (no grad)",
    "likelihood head (grad)",
    "likelihood head (no grad)",
    "KL reference backbone",
    "KL reference head",
    "backward",
    "optimizer",
    "other",
)


_MISSING = object()
PEAK_GFLOPS = {"cpu": 435.0, "cuda": 989_000.0}  # one Zen 5 core in bf16 (measured GEMM 430); H100/H200 dense bf16


def _synchronized_now(device: torch.device) -> float:
    torch.cuda.synchronize(device)
    return time.perf_counter()


class PhaseClock:
    """Exclusive thread time, wall time and FLOPs per phase: a wrapped call owns what its own wrapped
    callees do not."""

    def __init__(self, counter: FlopCounterMode | None, device: torch.device = torch.device("cpu")):
        self.counter = counter
        self.now = time.thread_time if device.type == "cpu" else functools.partial(_synchronized_now, device)
        self.thread: collections.Counter[str] = collections.Counter()
        self.wall: collections.Counter[str] = collections.Counter()
        self.flops: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.stack: list[list[float]] = []

    def _flops(self) -> float:
        return float(self.counter.get_total_flops()) if self.counter is not None else 0.0

    @contextlib.contextmanager
    def phase(self, name: str):
        frame = [self.now(), time.perf_counter(), self._flops(), 0.0, 0.0, 0.0]
        self.stack.append(frame)
        try:
            yield
        finally:
            self.stack.pop()
            spent = (self.now() - frame[0], time.perf_counter() - frame[1], self._flops() - frame[2])
            self.thread[name] += spent[0] - frame[3]
            self.wall[name] += spent[1] - frame[4]
            self.flops[name] += spent[2] - frame[5]
            self.calls[name] += 1
            if self.stack:
                parent = self.stack[-1]
                parent[3] += spent[0]
                parent[4] += spent[1]
                parent[5] += spent[2]

    def wrap(self, fn, name_of):
        """fn with its calls attributed to name_of(*args, **kwargs) (a phase name, or None: not wrapped)."""

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            name = name_of(*args, **kwargs)
            if name is None:
                return fn(*args, **kwargs)
            with self.phase(name):
                return fn(*args, **kwargs)

        return wrapped


ROLLOUT_FUNCTIONS = {("generate.py", "generate"), ("models.py", "nova_reference_rollout")}


def in_rollout() -> bool:
    """Whether a rollout function (margrpo.rollout's generate, the bench's reference rollout) is on the
    call stack (whatever module imports it under which name)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (code.co_filename.rsplit("/", 1)[-1], code.co_name) in ROLLOUT_FUNCTIONS:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def instrumented(clock: PhaseClock, policy, reference, trainer=None, optimizer=None):
    """Wrap the calls one step makes (restored on exit)."""
    patches: list[tuple[object, str, object]] = []

    def patch(owner, attr, name_of):
        if owner is None or not hasattr(owner, attr):
            return
        patches.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, clock.wrap(getattr(owner, attr), name_of))

    grad = torch.is_grad_enabled

    def backbone_phase(kind):
        def name_of(*args, **kwargs):
            if kind == "reference":
                return "KL reference backbone"
            if in_rollout():
                return "rollout backbone"
            return "likelihood backbone (grad)" if grad() else "likelihood backbone (no grad)"

        return name_of

    for model, kind in ((policy, "policy"), (reference, "reference")):
        if model is None:
            continue
        patch(model, "forward_z", backbone_phase(kind))
        patch(model, "encode_prompts", lambda *a, k=kind, **kw: "KL reference backbone" if k == "reference" else "prompts")
        patch(model, "decode", lambda *a, **kw: "decode")

    def head_phase(head, *args, **kwargs):
        if reference is not None and head is reference.head:
            return "KL reference head"
        if in_rollout():
            return "rollout head"
        return "likelihood head (grad)" if grad() else "likelihood head (no grad)"

    for function, name_of in (
        ("multi_seed_denoise", lambda *a, **kw: "rollout head"),
        ("eager_multi_seed_denoise", lambda *a, **kw: "rollout head"),
        ("transitions_logprob", head_phase),
        ("eager_denoise_logprob", head_phase),
    ):
        for module in [m for n, m in list(sys.modules.items()) if n.startswith("margrpo.") and m is not None]:
            if callable(vars(module).get(function)):
                patch(module, function, name_of)
    patch(torch.autograd, "backward", lambda *a, **kw: "backward")
    patch(torch.nn.utils, "clip_grad_norm_", lambda *a, **kw: "optimizer")
    for opt in (optimizer, getattr(trainer, "optimizer", None)):
        if opt is not None:
            patch(opt, "step", lambda *a, **kw: "optimizer")
            patch(opt, "zero_grad", lambda *a, **kw: "optimizer")
    if trainer is not None:
        patch(trainer, "reward", lambda *a, **kw: "reward")
    try:
        yield
    finally:
        for owner, attr, own in reversed(patches):
            if own is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)


def profile_step(run_step, clock: PhaseClock) -> dict:
    """Run run_step() once under the clock (and its FLOP counter); the phases' totals."""
    start_thread, start_wall = clock.now(), time.perf_counter()
    with clock.counter if clock.counter is not None else contextlib.nullcontext():
        with clock.phase("other"):
            run_step()
    total_thread, total_wall = clock.now() - start_thread, time.perf_counter() - start_wall
    return {"total_thread_s": total_thread, "total_wall_s": total_wall}


def traced_step(run_step, device: torch.device, top: int) -> dict:
    """One more step, uninstrumented (no FLOP counter, no phase synchronisations, which would inflate
    the host's share), traced by torch.profiler: margrpo.bench.kernel_profile's summary of it, with
    the compiles inside it."""
    from margrpo.bench.compiles import CompileWatch
    from margrpo.bench.kernel_profile import activities, summarize

    with CompileWatch() as watch, torch.profiler.profile(activities=activities(device)) as trace:
        watch.start("step")
        start = time.perf_counter()
        run_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
        watch.stop()
    return {**summarize(trace.events(), wall, device, top), "compiles": watch.report("step")}


def table(clock: PhaseClock, totals: dict, peak_gflops: float) -> list[dict]:
    rows = []
    all_flops = sum(clock.flops.values())
    for name in PHASES:
        if name not in clock.thread:
            continue
        t, f = clock.thread[name], clock.flops[name]
        rows.append(
            {
                "phase": name,
                "calls": clock.calls[name] - (1 if name == "other" else 0),
                "thread_s": t,
                "wall_s": clock.wall[name],
                "time_share": t / totals["total_thread_s"],
                "tflop": f / 1e12,
                "flop_share": f / all_flops if all_flops else 0.0,
                "gflops_per_s": f / t / 1e9 if t > 0 else 0.0,
                "mfu": f / t / (peak_gflops * 1e9) if t > 0 else 0.0,
            }
        )
    return rows


def format_rows(rows: list[dict], totals: dict, peak: float) -> str:
    lines = ["| phase | calls | time s | share | TFLOP | FLOP share | GFLOP/s | MFU |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['calls']} | {r['thread_s']:.1f} | {100 * r['time_share']:.1f}% | {r['tflop']:.3f} | "
            f"{100 * r['flop_share']:.1f}% | {r['gflops_per_s']:.0f} | {100 * r['mfu']:.1f}% |"
        )
    flops = sum(r["tflop"] for r in rows)
    lines.append(
        f"| **total** | | {totals['total_thread_s']:.1f} (wall {totals['total_wall_s']:.1f}) | 100% | {flops:.3f} | 100% | "
        f"{flops * 1e3 / totals['total_thread_s']:.0f} | {100 * flops * 1e3 / totals['total_thread_s'] / peak:.1f}% |"
    )
    return "\n".join(lines)


def head_flops_per_row_step(backbone, sampler) -> dict:
    """FLOPs of one head evaluation per row (token x trajectory x CFG half) and diffusion step: the
    official per-call forward (modulation recomputed) and the fused denoise (modulation once per
    token and step, shared by the K + 1 trajectories)."""
    head, rows = backbone.head, 64
    dtype = next(head.parameters()).dtype
    device = next(head.parameters()).device
    x = torch.randn(rows, head.in_channels, dtype=dtype, device=device)
    z = torch.randn(rows, head.z_channels, dtype=dtype, device=device)
    t = torch.full((rows,), float(sampler.model_time(0)), device=device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        head(x, t, z)
    official = counter.get_total_flops() / rows
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        modulation = head.modulation(head.embed_condition(z), t[:1].reshape(1, 1))
    mod = counter.get_total_flops() / rows
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        head.denoise(x, modulation)
    den = counter.get_total_flops() / rows
    return {"official_forward": official, "modulation": mod, "denoise": den}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m margrpo.bench.nova_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="nova-0.6b-random")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--mask-steps", type=int, default=4)
    parser.add_argument("--record-mask-steps", type=int, default=2)
    parser.add_argument("--record-diffusion-steps", type=int, default=10)
    parser.add_argument("--diffusion-steps", type=int, default=25)
    parser.add_argument("--num-seeds", type=int, default=3)
    parser.add_argument("--paths", default="fused", help="fused and/or reference, comma-separated")
    parser.add_argument("--device", default="cpu", help="cpu (thread CPU time, one torch thread) or cuda (synchronised wall time)")
    parser.add_argument("--peak-gflops", type=float, default=None, help="the peak for MFU (default: PEAK_GFLOPS of the device kind)")
    parser.add_argument("--no-flops", action="store_true", help="time only (no FlopCounterMode)")
    parser.add_argument(
        "--warmup-mask-steps",
        type=int,
        default=4,
        help="before each path's profiled step, one step of it on a schedule of this many mask steps (0: none; else >= 3, "
        "for a recorded step): "
        "the first step compiles (Triton kernels, the head's torch.compile graphs on CUDA)",
    )
    parser.add_argument(
        "--kernels",
        type=int,
        default=0,
        help="then trace one more step, uninstrumented, with torch.profiler and list this many top kernels (0: no trace)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if 0 < args.warmup_mask_steps < 3:
        parser.error(
            f"--warmup-mask-steps: got {args.warmup_mask_steps}, expected 0 (no warm-up) or >= 3 (a schedule with a recorded step)"
        )
    device = torch.device(args.device)
    if args.peak_gflops is None:
        args.peak_gflops = PEAK_GFLOPS[device.type]
    if device.type == "cpu":
        torch.set_num_threads(1)

    from margrpo.bench.compiles import CompileWatch, warn_if_compiled
    from margrpo.bench.kernel_profile import format_summary
    from margrpo.bench.machine import header, machine_description
    from margrpo.bench.models import NovaBenchSettings, _nova_trainer, train_step_on, trainer_reference_step
    from margrpo.models import nova
    from margrpo.rollout import choose_plan, effective_steps, mask_schedule

    settings = NovaBenchSettings(
        preset=args.preset,
        dtype=args.dtype,
        prompts=args.prompts,
        group_size=args.group_size,
        mask_steps=args.mask_steps,
        diffusion_steps=args.diffusion_steps,
        num_seeds=args.num_seeds,
        record_mask_steps=args.record_mask_steps,
        record_diffusion_steps=args.record_diffusion_steps,
        bf16=False,
    )
    info = machine_description(device)
    print(header(info), flush=True)
    began = time.perf_counter()
    backbone = nova.build(settings.preset, device=device, dtype=settings.dtype, seed=0)
    print(f"[nova_profile] built {settings.preset} ({settings.dtype}) in {time.perf_counter() - began:.0f} s", flush=True)
    sampler = backbone.make_sampler(settings.diffusion_steps)
    counts = mask_schedule(backbone.num_tokens, settings.mask_steps, "nova")
    report: dict = {
        "machine": info,
        "settings": {**dataclasses.asdict(settings), "tokens": backbone.num_tokens, "effective_mask_steps": len(effective_steps(counts))},
        "peak_gflops": args.peak_gflops,
        "head_flops_per_row_step": head_flops_per_row_step(backbone, sampler),
        "paths": {},
    }
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    with tempfile.TemporaryDirectory() as workdir:
        trainer = _nova_trainer(backbone, settings, device, Path(workdir))
        if device.type == "cpu":
            torch.set_num_threads(1)  # after the trainer, which applies run.threads
        report["settings"]["config"] = {k: v for k, v in dataclasses.asdict(trainer.config.grpo).items() if not isinstance(v, dict)}
        short = settings.rollout_config(args.warmup_mask_steps) if args.warmup_mask_steps else None
        for path in paths:
            clock = PhaseClock(None if args.no_flops else FlopCounterMode(display=False), device)
            if path == "fused":
                warm = None if short is None else functools.partial(train_step_on, trainer, short)
                plain = trainer.train_step  # outside `watched` the trainer is not instrumented
                step, watched = (
                    trainer.train_step,
                    functools.partial(instrumented, clock, trainer.policy, trainer.ref_policy, trainer=trainer),
                )
            elif path == "reference":
                optimizer = torch.optim.AdamW(trainer.policy.trainable_parameters(), lr=1e-6)
                prompts, generator = settings.batch_prompts, torch.Generator().manual_seed(0)
                reward = clock.wrap(trainer.reward, lambda *a, **kw: "reward")

                def reference(config, reward, prompts=prompts, optimizer=optimizer, generator=generator):
                    steps = mask_schedule(backbone.num_tokens, config.num_mask_steps, "nova")
                    plan = choose_plan(
                        steps, sampler, config.record_mask_steps, config.record_diffusion_steps, torch.Generator().manual_seed(0)
                    )
                    trainer_reference_step(trainer, optimizer, prompts, config, sampler, plan, generator, reward)

                warm = None if short is None else functools.partial(reference, short, trainer.reward)
                step = functools.partial(reference, settings.rollout_config(), reward)
                plain = functools.partial(reference, settings.rollout_config(), trainer.reward)
                watched = functools.partial(instrumented, clock, trainer.policy, trainer.ref_policy, optimizer=optimizer)
            else:
                raise SystemExit(f"--paths: got {path!r}, expected fused or reference")
            warmup_s = None
            if warm is not None:
                start = time.perf_counter()
                warm()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                warmup_s = time.perf_counter() - start
                print(f"[nova_profile] {path}: warm-up step ({short.num_mask_steps} mask steps) {warmup_s:.1f} s", flush=True)
            with CompileWatch() as watch:
                watch.start(path)
                with watched():
                    totals = profile_step(step, clock)
                watch.stop()
            rows = table(clock, totals, args.peak_gflops)
            compiles = watch.report(path)
            report["paths"][path] = {"totals": totals, "rows": rows, "warmup_s": warmup_s, "compiles_while_profiled": compiles}
            for line in warn_if_compiled({path: compiles}, "[nova_profile]"):
                print(line, flush=True)
            report["rows"] = [{"path": p, **row} for p, result in report["paths"].items() for row in result["rows"]]
            print(f"\n{path}: one step\n{format_rows(rows, totals, args.peak_gflops)}", flush=True)
            if args.json:  # before the trace's summary, which takes seconds on a GPU's tens of thousands of kernels
                Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
            if args.kernels:
                kernels = traced_step(plain, device, args.kernels)
                report["paths"][path]["kernels"] = kernels
                print(f"\n{path}: {format_summary(kernels)}", flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["head_flops_per_row_step"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
