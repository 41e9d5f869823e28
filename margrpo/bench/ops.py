"""Benchmark of the fused ops against unfused PyTorch: forward, backward and forward + backward.

For every op, size and mode it times: `eager` (the unfused chain as a competent user writes it: the
log-density by its formula, the std by mean / subtract / square / mean / sqrt), `eager[MAR-style]`
(where it differs, the chain as MAR codebases write it: torch.distributions.Normal, Tensor.std),
`compile` (torch.compile of the eager chain), `margrpo[<backend>]` (the public op of margrpo.ops on
each backend that runs on the device) and, in forward mode, `kernel[cpp|cuda]` (the extension's
forward kernels called directly on the kernel layouts, without the public op layer; grpo_surrogate's
forward kernel also computes the gradient). (margrpo/ops/oracle.py holds kernel-level contracts,
not an autograd baseline: its grpo_surrogate computes the gradient by hand; the `margrpo[torch]`
rows time those functions through the public op.)

Modes, for the ops training differentiates (gaussian_logprob: x, mean, std; grpo_surrogate: logp):
`forward` (inputs requiring grad, so the graph is recorded as in training), `backward` (the
backward pass alone: a fresh forward runs untimed before each timed call, with a fixed random
gradient of the output), `full` (forward + backward). trajectory_std+topk_mask (a selection score,
computed without gradient) and consistency_mask (a mask) are timed forward only.

Per row: p20 / p50 / p80 and min of the per-call times, and the speedup over eager as the median
[p20, p80] of per-round paired ratios (margrpo.bench.timing: every round runs each implementation
once, in a shuffled order that is recorded), and the memory of one call (margrpo.bench.memory: the
CUDA allocator's peak, or on CPU the bytes the call created and kept). Inputs are fresh random
tensors, never zeros; every implementation's output (and gradients) is first checked against eager's.

Sizes: a sweep over the number of tokens (`--tokens`, images of up to 1024 tokens of C = 16
channels, D0 = `--k` trajectories) or the named shapes [D0, B, N, C] (`--shapes`): D0 is the number
of seed trajectories K (nova K=3, harmon K=5) or of recorded diffusion steps (steps: 10), B images,
N = 1024 tokens; the `-x16` variants have 16x the images. Every op reads the shape its own way (see
`make_inputs`).

    margrpo bench ops --quick --json /tmp/ops.json --plot /tmp/ops.png
    margrpo bench ops --ops gaussian_logprob --modes backward --tokens 4096,65536
    python -m margrpo.bench.ops --device cuda --shapes steps-x16
    margrpo bench ops --device cuda --shapes nova,steps-x16 --write-table margrpo/ops/backend_table.json
    margrpo bench ops --from-json run1.json,run2.json --write-table T.json --assume-for nvidia-h100,other-cuda

The report ends with the shapes where no margrpo backend beats eager, or torch.compile
(margrpo.bench.table.verdicts); --write-table turns the rows into the backend order of `auto`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from margrpo.bench import memory
from margrpo.bench.machine import JsonReport, header, load_average, split_choices
from margrpo.bench.timing import Interleaved, Timed, interleave

OPS = ("gaussian_logprob", "trajectory_std+topk_mask", "consistency_mask", "grpo_surrogate")
MODES = ("forward", "backward", "full")
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "nova": (3, 4, 1024, 16),
    "harmon": (5, 4, 1024, 16),
    "steps": (10, 4, 1024, 16),
    "nova-x16": (3, 64, 1024, 16),
    "harmon-x16": (5, 64, 1024, 16),
    "steps-x16": (10, 64, 1024, 16),
}
TOKENS_PER_IMAGE = 1024  # NOVA and Harmon images: 32 x 32 tokens
CHANNELS = 16
DEFAULT_TOKENS = {"cpu": (1024, 4096, 16384), "cuda": (4096, 16384, 65536, 262144)}
QUICK_TOKENS = (256, 1024)
ORDER_ROUNDS_KEPT = 10  # rounds whose interleaving order the JSON records
TOPK_RATIO = 0.3  # MAR-GRPO's best top-k share of uncertain tokens
CLIP_EPS = 0.2
THRESHOLD = 0.0  # consistency threshold (the paper's best)

Inputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Size:
    """One point of the size axis: a label and the [D0, B, N, C] dims."""

    label: str
    dims: tuple[int, int, int, int]

    @property
    def tokens(self) -> int:
        return self.dims[1] * self.dims[2]


def token_sweep(tokens: tuple[int, ...], k: int = 3) -> list[Size]:
    """Sizes of `tokens` tokens each (B images of N = min(tokens, 1024) tokens), K = k trajectories."""
    if k < 2:
        raise ValueError(f"k: got {k}, expected at least 2 trajectories (trajectory_std needs two)")
    sizes = []
    for t in tokens:
        n = min(t, TOKENS_PER_IMAGE)
        if t < 1 or t % n:
            raise ValueError(f"tokens: got {t}, expected a positive count below {TOKENS_PER_IMAGE} or a multiple of it")
        sizes.append(Size(f"{t} tokens", (k, t // n, n, CHANNELS)))
    return sizes


def named_shapes(names: tuple[str, ...]) -> list[Size]:
    for name in names:
        if name not in SHAPES:
            raise ValueError(f"shapes: got {name!r}, expected names from {', '.join(SHAPES)}")
    return [Size(name, SHAPES[name]) for name in names]


# ---------------------------------------------------------------- inputs
def make_inputs(op: str, shape: tuple[int, int, int, int], device: torch.device, seed: int = 0) -> Inputs:
    """Fresh random inputs of `op` for a [D0, B, N, C] shape, float32 (the inputs of GRAD_INPUTS
    require grad).

    gaussian_logprob: x, mean, std (per element, as a learned-range variance gives) [D0, B, N, C];
    trajectory_std+topk_mask: samples [K = D0, B, N, C]; consistency_mask: prev, cur, final
    [D0, B, N, C] (D0 mask steps at once); grpo_surrogate: logp, old_logp [T = D0, B, N],
    advantages [B], kept-token mask and MTE mask [B, N].
    """
    if op not in OPS:
        raise ValueError(f"op: got {op!r}, expected one of {', '.join(OPS)}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    d0, b, n, c = shape

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=g).to(device)

    if op == "gaussian_logprob":
        std = torch.rand((d0, b, n, c), generator=g).mul_(0.9).add_(0.1).to(device)
        inputs = {"x": randn(d0, b, n, c), "mean": randn(d0, b, n, c), "std": std}
        return {name: t.requires_grad_(True) for name, t in inputs.items()}
    if op == "trajectory_std+topk_mask":
        return {"samples": randn(d0, b, n, c)}
    if op == "consistency_mask":
        final = randn(d0, b, n, c)
        return {"prev": final + 2.0 * randn(d0, b, n, c), "cur": final + randn(d0, b, n, c), "final": final}
    old = randn(d0, b, n).mul_(0.5).sub_(30.0)
    return {
        "logp": (old + 0.2 * randn(d0, b, n)).requires_grad_(True),
        "old_logp": old,
        "advantages": randn(b),
        "mask": torch.rand((b, n), generator=g).to(device) < 0.9,
        "mte_mask": torch.rand((b, n), generator=g).to(device) < TOPK_RATIO,
    }


# ---------------------------------------------------------------- the unfused chains (eager / compile)
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _eager_gaussian_logprob(t: Inputs) -> torch.Tensor:
    """The log-density by its formula, as a competent user writes it."""
    z = (t["x"] - t["mean"]) / t["std"]
    return (-0.5 * z.square() - t["std"].log() - HALF_LOG_2PI).sum(-1)


def _mar_style_gaussian_logprob(t: Inputs) -> torch.Tensor:
    """As MAR codebases write it: through torch.distributions.Normal (argument checks, broadcasts)."""
    return torch.distributions.Normal(t["mean"], t["std"]).log_prob(t["x"]).sum(-1)


def _top_share(scores: torch.Tensor) -> torch.Tensor:
    k = math.floor(TOPK_RATIO * scores.shape[-1])
    idx = torch.topk(scores, k, dim=-1).indices
    return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(1, idx, True)


def _eager_std_topk(t: Inputs) -> torch.Tensor:
    """The population std over K by mean / subtract / square / mean / sqrt (Tensor.std(0) takes a
    CPU slow path about 65x slower), channel mean, then top-k."""
    samples = t["samples"]
    std = (samples - samples.mean(0)).square().mean(0).sqrt()
    return _top_share(std.mean(-1))


def _mar_style_std_topk(t: Inputs) -> torch.Tensor:
    """As MAR codebases write it: Tensor.std over the seed axis."""
    return _top_share(t["samples"].std(0, unbiased=False).mean(-1))


def _eager_consistency(t: Inputs) -> torch.Tensor:
    gain = F.cosine_similarity(t["cur"], t["final"], dim=-1) - F.cosine_similarity(t["prev"], t["final"], dim=-1)
    return gain > THRESHOLD


def _eager_grpo_forward(t: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clip with MTE: loss, clip fraction and k3 KL, the way a training loop logs them."""
    log_ratio = t["logp"] - t["old_logp"]
    ratio = torch.exp(log_ratio)
    adv = t["advantages"][None, :, None]
    per_term = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - CLIP_EPS, 1.0 + CLIP_EPS))
    per_token = torch.where(t["mte_mask"], per_term.mean(0), per_term[0])
    mask = t["mask"].float()
    denom = mask.sum().clamp_min(1.0)
    loss = (per_token * mask).sum() / denom
    clip_fraction = (((ratio[0] - 1.0).abs() > CLIP_EPS).float() * mask).sum() / denom
    approx_kl = (((ratio[0] - 1.0) - log_ratio[0]) * mask).sum() / denom
    return loss, clip_fraction.detach(), approx_kl.detach()


_EAGER: dict[str, Callable[[Inputs], object]] = {
    "gaussian_logprob": _eager_gaussian_logprob,
    "trajectory_std+topk_mask": _eager_std_topk,
    "consistency_mask": _eager_consistency,
    "grpo_surrogate": _eager_grpo_forward,
}
# the "as MAR codebases write it" variants, timed beside the competent eager chain and labelled so
_MAR_STYLE: dict[str, Callable[[Inputs], object]] = {
    "gaussian_logprob": _mar_style_gaussian_logprob,
    "trajectory_std+topk_mask": _mar_style_std_topk,
}


# the inputs each op's gradient flows to in training (ops absent here are timed forward only)
GRAD_INPUTS: dict[str, tuple[str, ...]] = {"gaussian_logprob": ("x", "mean", "std"), "grpo_surrogate": ("logp",)}


# ---------------------------------------------------------------- the fused margrpo ops
def _fused(op: str) -> Callable[[Inputs], object]:
    import margrpo.ops as ops

    if op == "gaussian_logprob":
        # check_std=False: the sync-free path the samplers take on a GPU
        return lambda t: ops.gaussian_logprob(t["x"], t["mean"], t["std"], reduce="sum", check_std=False)
    if op == "trajectory_std+topk_mask":
        # check_finite=False: the scores come from a std, the hot path skips the NaN scan
        return lambda t: ops.topk_mask(ops.trajectory_std(t["samples"]), ratio=TOPK_RATIO, check_finite=False)
    if op == "consistency_mask":
        return lambda t: ops.consistency_mask(t["prev"], t["cur"], t["final"], threshold=THRESHOLD)
    return lambda t: ops.grpo_surrogate(t["logp"], t["old_logp"], t["advantages"], t["mask"], clip_eps=CLIP_EPS, mte_mask=t["mte_mask"])


def _kernel_level(op: str) -> Callable[[Inputs], object]:
    """The same computation as the fused op, calling torch.ops.margrpo.* on the kernel layouts of
    docs/CONTRACTS.md directly: the forward kernels' cost without the public op layer's Python.
    No autograd (inputs detached): forward mode only."""
    k = torch.ops.margrpo

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.detach().reshape(-1, t.shape[-1])

    if op == "gaussian_logprob":
        return lambda t: k.gaussian_logprob_fwd(flat(t["x"]), flat(t["mean"]), flat(t["std"]), 1).reshape(t["x"].shape[:-1])
    if op == "trajectory_std+topk_mask":

        def std_topk(t: Inputs) -> torch.Tensor:
            s = t["samples"]
            scores = k.trajectory_std_fwd(s.reshape(s.shape[0], -1, s.shape[-1])).reshape(s.shape[1:-1])
            return k.topk_mask_fwd(scores, math.floor(TOPK_RATIO * scores.shape[-1]))

        return std_topk
    if op == "consistency_mask":
        return lambda t: k.consistency_mask_fwd(flat(t["prev"]), flat(t["cur"]), flat(t["final"]), THRESHOLD).reshape(t["cur"].shape[:-1])

    def surrogate(t: Inputs) -> tuple[torch.Tensor, ...]:
        mask = t["mask"].float()
        weights = mask / mask.sum().clamp_min(1.0)  # token_mean aggregation
        logp = t["logp"].detach()
        return k.grpo_surrogate_fwd(logp, t["old_logp"], t["advantages"], weights, t["mte_mask"], CLIP_EPS, CLIP_EPS)

    return surrogate


def _backends_on(device: torch.device) -> list[str]:
    """The margrpo backends that run on `device` in this installation (triton only on a GPU)."""
    try:
        import margrpo.ops as ops
    except ImportError:
        return []
    names = ops.available_backends()
    if device.type == "cuda":
        return [n for n in ("triton", "cuda", "torch") if n in names]
    return [n for n in ("cpp", "torch") if n in names]


def implementations(op: str, device: torch.device, compile: bool = True) -> dict[str, Callable[[Inputs], object]]:
    """impl name -> callable(inputs) -> the op's output, for `op` on `device`: eager,
    eager[MAR-style], compile, margrpo[<backend>] (the public op) and kernel[cpp|cuda] (the
    extension's forward kernels called directly; see `differentiable`)."""
    eager = _EAGER[op]
    impls: dict[str, Callable[[Inputs], object]] = {"eager": eager}
    if op in _MAR_STYLE:
        impls["eager[MAR-style]"] = _MAR_STYLE[op]
    if compile:
        impls["compile"] = torch.compile(eager, dynamic=False)
    for backend in _backends_on(device):
        fused = _fused(op)

        def call(t: Inputs, fused=fused, backend=backend) -> object:
            import margrpo.ops as ops

            with ops.use_backend(backend):
                return fused(t)

        impls[f"margrpo[{backend}]"] = call
        if backend in ("cpp", "cuda"):
            impls[f"kernel[{backend}]"] = _kernel_level(op)
    return impls


def differentiable(impl: str) -> bool:
    """Whether an implementation has a backward (the direct kernel calls have none)."""
    return not impl.startswith("kernel[")


def assert_agrees(op: str, got: object, expected: object) -> None:
    """Raise AssertionError unless an implementation's output matches eager's (timing a wrong result
    means nothing). Masks may differ on a few positions whose margin is within float rounding."""
    if op in ("trajectory_std+topk_mask", "consistency_mask"):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == torch.bool
        mismatch = (got != expected).float().mean().item()
        assert mismatch <= 1e-3, f"{op}: {mismatch:.2%} of the mask differs from eager"
        return
    # gaussian_logprob: log-densities; grpo_surrogate: the loss
    atol = 1e-3 if op == "gaussian_logprob" else 1e-9
    got, expected = primary(got), primary(expected)
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=atol, msg=lambda m: f"{op}: {m}")


def assert_grads_agree(op: str, got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """Raise AssertionError unless an implementation's gradients match eager's."""
    for g, e in zip(got, expected, strict=True):
        scale = float(e.abs().max()) if e.numel() else 1.0
        torch.testing.assert_close(g.float(), e.float(), rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{op} gradient: {m}")


# ---------------------------------------------------------------- modes
def primary(out: object) -> torch.Tensor:
    """The differentiated output: the tensor itself, or the first of a tuple (grpo_surrogate's loss)."""
    return out[0] if isinstance(out, tuple) else out


def mode_call(
    mode: str, fn: Callable[[Inputs], object], inputs: Inputs, grad_inputs: tuple[str, ...], grad_out: torch.Tensor | None
) -> Timed:
    """What one timed call of `fn` in `mode` runs. forward: fn(inputs); backward: the backward of
    a forward run in the untimed setup, returning the gradients; full: both, returning (output,
    gradients). grad_out: the gradient of the output (None for a 0-d loss)."""
    if mode not in MODES:
        raise ValueError(f"mode: got {mode!r}, expected one of {', '.join(MODES)}")
    leaves = [inputs[name] for name in grad_inputs]

    def clear() -> None:
        for t in leaves:
            t.grad = None

    def backward(y: torch.Tensor) -> list[torch.Tensor]:
        y.backward(grad_out)
        return [t.grad for t in leaves]

    if mode == "forward":
        return Timed(lambda: fn(inputs))
    if mode == "backward":

        def forward() -> torch.Tensor:
            clear()
            return primary(fn(inputs))

        return Timed(backward, setup=forward)

    def full(_: None) -> tuple[object, list[torch.Tensor]]:
        out = fn(inputs)
        return out, backward(primary(out))

    return Timed(full, setup=clear)


def _run_once(timed: Timed) -> object:
    return timed.call(timed.setup()) if timed.setup else timed.call()


@dataclass(frozen=True)
class OpBench:
    """What `run` needs of an op: its inputs, implementations, differentiated inputs and checks."""

    make_inputs: Callable[[tuple[int, int, int, int], torch.device], Inputs]
    implementations: Callable[[torch.device, bool], dict[str, Callable[[Inputs], object]]]
    grad_inputs: tuple[str, ...]  # () -> timed forward only
    check: Callable[[object, object], None]  # (output, eager's output)
    check_grads: Callable[[list, list], None]  # (gradients, eager's gradients)


def op_bench(op: str) -> OpBench:
    """The OpBench of one of OPS."""
    if op not in OPS:
        raise ValueError(f"op: got {op!r}, expected one of {', '.join(OPS)}")
    return OpBench(
        lambda dims, device: make_inputs(op, dims, device),
        lambda device, compile: implementations(op, device, compile=compile),
        GRAD_INPUTS.get(op, ()),
        lambda got, expected: assert_agrees(op, got, expected),
        lambda got, expected: assert_grads_agree(op, got, expected),
    )


# ---------------------------------------------------------------- the run
@dataclass
class Row:
    op: str
    size: str
    dims: list[int]
    tokens: int
    mode: str
    impl: str
    device: str
    p20_ms: float
    p50_ms: float
    p80_ms: float
    min_ms: float
    rounds: int
    speedup: float  # median over rounds of eager's time / this time, in the same round
    speedup_p20: float
    speedup_p80: float
    mem_mb: float  # margrpo.bench.memory.method(device)


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    # per (op, size, mode): the rounds and the interleaving order of the first ORDER_ROUNDS_KEPT
    groups: list[dict] = field(default_factory=list)


def _rows(op: str, size: Size, mode: str, device: torch.device, timed: Interleaved, mem: dict[str, float]) -> list[Row]:
    rows = []
    for impl in timed.times:
        st, ratio = timed.stats(impl), timed.ratio("eager", impl)
        rows.append(
            Row(
                op,
                size.label,
                list(size.dims),
                size.tokens,
                mode,
                impl,
                device.type,
                st.p20,
                st.p50,
                st.p80,
                st.min,
                st.n,
                ratio.p50,
                ratio.p20,
                ratio.p80,
                mem[impl],
            )
        )
    return rows


def run(
    ops: tuple[str, ...] = OPS,
    sizes: list[Size] | None = None,
    device: str | torch.device = "cpu",
    modes: tuple[str, ...] = MODES,
    compile: bool = True,
    min_time_s: float = 0.3,
    warmup: int = 3,
    min_rounds: int = 10,
    max_rounds: int = 500,
    benches: dict[str, OpBench] | None = None,
    log: Callable[[str], None] | None = None,
    on_row: Callable[[Row], None] | None = None,
) -> Result:
    """Time every implementation of every op on every size in every mode the op has; the rows
    carry speedups over eager. `benches` replaces the ops' OpBench (tests); on_row(row) is called
    as each row is measured."""
    device = torch.device(device)
    sizes = token_sweep(DEFAULT_TOKENS["cuda" if device.type == "cuda" else "cpu"]) if sizes is None else sizes
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes: got {mode!r}, expected some of {', '.join(MODES)}")
    result = Result()
    for op in ops:
        bench = benches[op] if benches is not None else op_bench(op)
        op_modes = [m for m in modes if m == "forward" or bench.grad_inputs]
        for size in sizes:
            if compile:
                torch._dynamo.reset()  # a fresh compile per size: dynamic=False recompiles past the cache limit
            impls = bench.implementations(device, compile)
            inputs = bench.make_inputs(size.dims, device)
            expected = impls["eager"](inputs)
            grad_out = None
            if bench.grad_inputs and primary(expected).ndim:
                g = torch.Generator(device="cpu").manual_seed(1)
                grad_out = torch.randn(primary(expected).shape, generator=g).to(device)
            for mode in op_modes:
                names = [n for n in impls if mode == "forward" or differentiable(n)]
                calls = {n: mode_call(mode, impls[n], inputs, bench.grad_inputs, grad_out) for n in names}
                reference = _run_once(calls["eager"])
                for name, call in calls.items():
                    got = _run_once(call)
                    if mode != "backward":
                        bench.check(got[0] if mode == "full" else got, reference[0] if mode == "full" else reference)
                    if mode != "forward":
                        bench.check_grads(got if mode == "backward" else got[1], reference if mode == "backward" else reference[1])
                timed = interleave(calls, device, min_time_s, warmup, min_rounds, max_rounds)
                mem = {n: memory.call_mb(call, device, inputs) for n, call in calls.items()}
                result.groups.append(
                    {
                        "op": op,
                        "size": size.label,
                        "tokens": size.tokens,
                        "mode": mode,
                        "rounds": len(timed.order),
                        "order": timed.order[:ORDER_ROUNDS_KEPT],
                    }
                )
                for row in _rows(op, size, mode, device, timed, mem):
                    result.rows.append(row)
                    if log:
                        log(
                            f"{op:<24} {size.label:<12} {mode:<8} {row.impl:<16} p50 {row.p50_ms:9.3f} ms "
                            f"(min {row.min_ms:.3f}) {row.speedup:6.2f}x {row.mem_mb:8.3g} MB"
                        )
                    if on_row:
                        on_row(row)
    return result


def format_table(rows: list[Row]) -> str:
    """A markdown table: times (p50, p20, p80, min), speedup over eager (paired per round) and memory."""
    lines = [
        "| op | mode | size | tokens | impl | p50 (ms) | p20 (ms) | p80 (ms) | min (ms) | speedup vs eager p50 [p20, p80] | memory (MB) |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        dims = "x".join(str(d) for d in r.dims)
        lines.append(
            f"| {r.op} | {r.mode} | {r.size} [{dims}] | {r.tokens} | {r.impl} | {r.p50_ms:.3f} | {r.p20_ms:.3f} "
            f"| {r.p80_ms:.3f} | {r.min_ms:.3f} | {r.speedup:.2f}x [{r.speedup_p20:.2f}, {r.speedup_p80:.2f}] "
            f"| {r.mem_mb:.3g} |"
        )
    return "\n".join(lines)


def _ints(value: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v)
    except ValueError:
        raise SystemExit(f"--{name}: got {value!r}, expected a comma list of integers") from None


def main(argv: list[str] | None = None) -> int:
    """CLI: `margrpo bench ops` / `python -m margrpo.bench.ops`; prints the header and the table,
    optionally writes JSON and a speedup plot."""
    parser = argparse.ArgumentParser(prog="margrpo bench ops", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    parser.add_argument(
        "--tokens",
        help="size sweep: comma list of token counts (default: "
        + "; ".join(f"{d}: {','.join(map(str, t))}" for d, t in DEFAULT_TOKENS.items())
        + ")",
    )
    parser.add_argument("--k", type=int, default=3, help="trajectories D0 of the --tokens sweep (default 3, NOVA)")
    parser.add_argument("--shapes", help="named shapes instead of (or with) --tokens: " + ", ".join(SHAPES))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per implementation")
    parser.add_argument("--min-rounds", type=int, default=10, help="rounds at least, whatever --min-time")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run (tests, smoke): tokens {','.join(map(str, QUICK_TOKENS))} unless given, no compile, 5 rounds, 1 warm-up call",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the CPU run (default: torch's)")
    parser.add_argument("--json", help="write the rows, the interleaving orders and the machine description here")
    parser.add_argument("--plot", help="write a PNG of speedup vs tokens here (one panel per op and mode)")
    parser.add_argument(
        "--write-table",
        metavar="PATH",
        help="write the backend table of `auto` (margrpo/ops/backend_table.json's layout) from this run's "
        "rows, or from --from-json; entries of other ops and device kinds in PATH are kept",
    )
    parser.add_argument(
        "--assume-for",
        metavar="KIND[,KIND]",
        default="",
        help="with --write-table: GPU device kinds without figures (nvidia-h100, other-cuda) that take "
        "the measured GPU's entries, marked assumed_from",
    )
    parser.add_argument(
        "--from-json",
        metavar="R.json[,R2.json]",
        help="no run: read the rows of earlier --json reports (for --write-table and the verdicts)",
    )
    args = parser.parse_args(argv)
    if args.from_json:
        return _from_reports(args.from_json.split(","), args.write_table, _kinds(args.assume_for))
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = named_shapes(split_choices(args.shapes, tuple(SHAPES), "shapes")) if args.shapes else []
    tokens = _ints(args.tokens, "tokens") if args.tokens else None
    if tokens is None and not sizes:
        tokens = QUICK_TOKENS if args.quick else DEFAULT_TOKENS["cuda" if device.type == "cuda" else "cpu"]
    try:
        sizes += token_sweep(tokens, args.k) if tokens else []
    except ValueError as err:
        raise SystemExit(f"--tokens/--k: {err}") from None
    report = JsonReport(
        args.json,
        device,
        memory=memory.method(device),
        speedup="median [p20, p80] over rounds of eager's time / the implementation's, same round",
    )
    print(f"{header(report.head['machine'])}\nmemory: {memory.method(device)}", flush=True)
    result = run(
        split_choices(args.ops, OPS, "ops"),
        sizes,
        device,
        split_choices(args.modes, MODES, "modes"),
        compile=not (args.no_compile or args.quick),
        min_time_s=0.0 if args.quick else args.min_time,
        warmup=1 if args.quick else 3,
        min_rounds=5 if args.quick else args.min_rounds,
        max_rounds=5 if args.quick else max(500, args.min_rounds),
        log=lambda line: print(line, file=sys.stderr, flush=True),
        on_row=lambda row: report.add(asdict(row)),
    )
    report.set("groups", result.groups)
    report.set("load_average_end", load_average())
    print(format_table(result.rows))
    print(f"load average (1/5/15 min) at the end: {' '.join(map(str, load_average() or ['unavailable']))}")
    _print_verdicts([asdict(r) for r in result.rows])
    if args.write_table:
        _write_table(
            args.write_table,
            [{"machine": report.head["machine"], "rows": report.rows}],
            [args.json or f"margrpo bench ops on {device}"],
            _kinds(args.assume_for),
        )
    if args.plot:
        from margrpo.bench.plot import speedup_plot

        speedup_plot([asdict(r) for r in result.rows], args.plot, title=f"margrpo bench ops, {device.type}")
        print(f"plot: {args.plot}")
    return 0


def _print_verdicts(rows: list[dict]) -> None:
    from margrpo.bench.table import verdicts

    lines = verdicts(rows)
    print("\n".join(["where margrpo loses:"] + lines) if lines else "margrpo beats eager and compile at every shape measured")


def _kinds(value: str) -> tuple[str, ...]:
    from margrpo.ops._table import DEVICE_KINDS

    return split_choices(value, DEVICE_KINDS, "assume-for") if value else ()


def _write_table(path: str, reports: list[dict], sources: list[str], assume_for: tuple[str, ...] = ()) -> None:
    from margrpo.bench.table import write

    try:
        new = write(path, reports, sources, assume_for=assume_for)
    except ValueError as err:
        raise SystemExit(f"--write-table: {err}") from None
    print(f"backend table: {len(new)} entries written to {path}")


def _from_reports(paths: list[str], table: str | None, assume_for: tuple[str, ...] = ()) -> int:
    """--from-json: the verdicts of saved reports, and the table written from them."""
    import json

    reports = []
    for path in paths:
        try:
            with open(path) as f:
                reports.append(json.load(f))
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"--from-json: {path}: {err}") from None
    for path, report in zip(paths, reports):
        print(f"{path}:")
        _print_verdicts(report.get("rows") or [])
    if table:
        _write_table(table, reports, paths, assume_for)
    return 0


if __name__ == "__main__":
    sys.exit(main())
