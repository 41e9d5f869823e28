"""Host-side cost of the diffusion heads, measurable without a GPU.

  adaln    CPU microseconds per fused adaLN call (ops.ln_modulate / gate_residual on the
           Triton path) with the Triton kernel replaced by a stub: what margrpo adds on top of
           Triton's own launch, per call (a NOVA d6w1024 diffusion step makes 13 such calls), and
           one torch.empty of the output's size for scale. p20 / p50 / p80 and min over rounds of
           `calls` calls each, the three interleaved in a shuffled order per round (margrpo.bench.timing,
           this thread's CPU time).
  launches kernel launches per diffusion step of a head (modulation + guided denoise), counted
           under a dispatch mode (margrpo.bench.op_counts) plus one per Triton kernel call, on the
           torch and the triton path.

  ops      CPU microseconds per call of each public op (margrpo.ops) against its raw kernel call
           torch.ops.margrpo.<op>_fwd, on tiny tensors and at the NOVA shape (margrpo.bench.host_ops).

adaln and launches: tensors live on the meta device (shapes only), so the figures are the host's alone.

    margrpo bench host --json host.json
    margrpo bench host --sections ops --rounds 21
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from margrpo import ops
from margrpo.bench.machine import header, load_average, machine_description, split_choices
from margrpo.bench.op_counts import count_ops
from margrpo.bench.timing import interleave
from margrpo.heads import Guidance, mar_head, nova_head
from margrpo.heads.multi_seed import guided_output
from margrpo.ops import _backend, _kernels

SECTIONS = ("ops", "heads")  # heads: the adaln and launches tables
# (name, head builder, K seed trajectories, guidance) at the real sizes of margrpo.bench.denoise
HEADS = {
    "nova-d6w1024": (lambda: nova_head("d6w1024", 1024), 3, Guidance(5.0)),
    "harmon-mar_h": (lambda: mar_head("mar_h", 16, 1280), 5, Guidance(3.0, channels="eps")),
}


class _StubKernel:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **meta)` only counts the call."""

    def __init__(self):
        self.calls = 0

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        self.calls += 1


@contextmanager
def stubbed_adaln_kernels():
    """margrpo.kernels.adaln with both Triton kernels replaced by stubs, the triton backend allowed on
    any device (meta included), and the ops' eager route taken under count_ops' dispatch mode (the
    route they take outside it); yields the stubs."""
    from margrpo.kernels import adaln

    names = ("_ln_modulate_kernel", "_gate_residual_kernel")
    saved = {name: getattr(adaln, name) for name in names}
    stubs = {name: _StubKernel() for name in names}
    for name, stub in stubs.items():
        setattr(adaln, name, stub)
    runs_on, direct = _backend._runs_on, _kernels.direct_call_allowed
    _backend._runs_on = lambda name, device: name == "triton" or runs_on(name, device)
    _kernels.direct_call_allowed = lambda: True
    try:
        yield stubs
    finally:
        _backend._runs_on, _kernels.direct_call_allowed = runs_on, direct
        for name, kernel in saved.items():
            setattr(adaln, name, kernel)


@dataclass
class AdalnRow:
    primitive: str
    x_shape: tuple[int, ...]
    modulation_shape: tuple[int, ...]
    us_per_call: float  # the median over rounds (= p50_us)
    p20_us: float
    p50_us: float
    p80_us: float
    min_us: float
    rounds: int


def adaln_overhead(
    tokens: int = 1024, width: int = 1024, trajectories: int = 4, calls: int = 2000, rounds: int = 7, order: list | None = None
) -> list[AdalnRow]:
    """Host microseconds per adaLN op call (margrpo.ops) on the Triton path, kernels stubbed: x
    [K+1, 1, N, W] against a CFG modulation [2, N, W], as in a guided multi-seed step. Each round
    times `calls` calls of each primitive in CPU time of this thread (not wall time: on a shared
    machine the wait for a core is not the wrapper's cost); the rounds' orders go to `order`."""
    meta = torch.device("meta")
    x = torch.empty(trajectories, 1, tokens, width, device=meta)
    h = torch.empty(trajectories, 2, tokens, width, device=meta)
    mod = torch.empty(2, tokens, width, device=meta)
    weight, bias = torch.empty(width, device=meta), torch.empty(width, device=meta)
    cases = {
        "ln_modulate": (lambda: ops.ln_modulate(x, mod, mod, None, None, 1e-6, backend="triton"), x),
        "gate_residual": (lambda: ops.gate_residual(h, h, mod, weight, bias, 1e-5, backend="triton"), h),
        # for scale: the output allocation alone (ln_modulate makes one; gate_residual writes in place)
        "torch.empty": (lambda: torch.empty(h.shape, device=meta), h),
    }

    def repeated(fn):
        def run():
            for _ in range(calls):
                fn()

        return run

    with torch.no_grad(), stubbed_adaln_kernels():
        timed = interleave(
            {name: repeated(fn) for name, (fn, _) in cases.items()},
            torch.device("cpu"),
            min_time_s=0.0,
            warmup=1,
            min_rounds=rounds,
            max_rounds=rounds,
            clock=time.thread_time,
        )
    if order is not None:
        order.extend(timed.order)
    rows = []
    for name, (_, first) in cases.items():
        st = timed.stats(name)
        per_call = [v * 1e3 / calls for v in (st.p20, st.p50, st.p80, st.min)]  # ms per round -> us per call
        rows.append(AdalnRow(name, tuple(first.shape), tuple(mod.shape), per_call[1], *per_call, st.n))
    return rows


@dataclass
class LaunchRow:
    head: str
    path: str
    tokens: int
    trajectories: int
    aten_launches: int
    triton_launches: int
    launches_per_step: int


def head_step_launches(tokens: int = 1024) -> list[LaunchRow]:
    """Kernel launches of one guided multi-seed diffusion step of each head: the modulation of the
    step (condition embedding excluded: it is computed once per chain) and the guided denoise."""
    meta = torch.device("meta")
    rows = []
    for name, (build, num_seeds, guidance) in HEADS.items():
        with torch.device(meta):
            head = build()
            z = torch.empty(2, tokens, head.z_channels)
            x = torch.empty(num_seeds + 1, tokens, head.in_channels)
            t = torch.empty(())
        with torch.no_grad():
            cond = head.embed_condition(z)
            for path in ("torch", "triton"):
                with stubbed_adaln_kernels() as stubs, count_ops() as counts:
                    guided_output(head, head.modulation(cond, t), x, guidance, backend=path)
                triton = sum(stub.calls for stub in stubs.values())
                rows.append(LaunchRow(name, path, tokens, num_seeds + 1, counts.launches, triton, counts.launches + triton))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="margrpo bench host", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS))
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the ops section (default 15)")
    args = parser.parse_args(argv)
    sections = split_choices(args.sections, SECTIONS, "sections")
    machine = machine_description(torch.device("cpu"))
    print(header(machine), flush=True)
    report: dict[str, object] = {"machine": machine}
    if "ops" in sections:
        from margrpo.bench import host_ops

        op_order: list[dict] = []
        op_rows = host_ops.op_overhead(rounds=args.rounds, order=op_order)
        print(host_ops.format_rows(op_rows))
        report |= {"ops": [asdict(r) for r in op_rows], "ops_order": op_order}
    if "heads" in sections:
        report |= _heads()
    report["load_average_end"] = load_average()
    print(f"load average (1/5/15 min) at the end: {' '.join(map(str, load_average() or ['unavailable']))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _heads() -> dict[str, object]:
    """The adaln and launches sections: printed, and returned for the JSON report."""
    order: list[list[str]] = []
    adaln, launches = adaln_overhead(order=order), head_step_launches()
    print(f"{'adaLN primitive':<15} {'x':<20} {'modulation':<16} {'rounds':>6} {'p50 us':>8} {'p20 us':>8} {'p80 us':>8} {'min us':>8}")
    for r in adaln:
        print(
            f"{r.primitive:<15} {str(r.x_shape):<20} {str(r.modulation_shape):<16} {r.rounds:>6} {r.p50_us:>8.2f} "
            f"{r.p20_us:>8.2f} {r.p80_us:>8.2f} {r.min_us:>8.2f}"
        )
    print(f"\n{'head':<14} {'path':<7} {'N':>5} {'K+1':>4} {'aten':>5} {'triton':>7} {'launches/step':>14}")
    for r in launches:
        print(
            f"{r.head:<14} {r.path:<7} {r.tokens:>5} {r.trajectories:>4} {r.aten_launches:>5} {r.triton_launches:>7} "
            f"{r.launches_per_step:>14}"
        )
    return {"adaln": [asdict(r) for r in adaln], "adaln_order": order, "launches": [asdict(r) for r in launches]}


if __name__ == "__main__":
    raise SystemExit(main())
