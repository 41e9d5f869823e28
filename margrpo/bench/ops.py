"""Benchmark of the fused ops against unfused PyTorch.

For every op and shape it times: `eager` (the unfused chain as a competent user writes it: the
log-density by its formula, the std by mean / subtract / square / mean / sqrt), `eager[MAR-style]`
(where it differs, the chain as MAR codebases write it: torch.distributions.Normal, Tensor.std),
`compile` (torch.compile of the eager chain), `margrpo[<backend>]` (the public op of margrpo.ops on
each backend that runs on the device) and `kernel[cpp|cuda]` (the extension's kernels called
directly on the kernel layouts, without the public op layer). Speedups are against `eager`.
Medians and minima after warmup, implementations interleaved (margrpo.bench.timing): perf_counter
on CPU, CUDA events on CUDA. Inputs are fresh random tensors, never zeros, and every
implementation's output is first checked against eager's.

    python -m margrpo.bench.ops --device cpu --json results.json
    margrpo bench ops --ops gaussian_logprob --shapes steps,steps-x16

Shapes are [D0, B, N, C]: D0 is the number of seed trajectories K (nova K=3, harmon K=5) or of
recorded diffusion steps (steps: 10), B images, N = 1024 tokens of C = 16 channels; the `-x16`
variants have 16x the images. Every op reads the shape its own way (see `make_inputs`).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from margrpo.bench.machine import JsonReport, split_choices
from margrpo.bench.timing import interleaved_ms

OPS = ("gaussian_logprob", "trajectory_std+topk_mask", "consistency_mask", "grpo_surrogate")
SHAPES: dict[str, tuple[int, int, int, int]] = {
    "nova": (3, 4, 1024, 16),
    "harmon": (5, 4, 1024, 16),
    "steps": (10, 4, 1024, 16),
    "nova-x16": (3, 64, 1024, 16),
    "harmon-x16": (5, 64, 1024, 16),
    "steps-x16": (10, 64, 1024, 16),
}
TOPK_RATIO = 0.3  # MAR-GRPO's best top-k share of uncertain tokens
CLIP_EPS = 0.2
THRESHOLD = 0.0  # consistency threshold (the paper's best)

Inputs = dict[str, torch.Tensor]


# ---------------------------------------------------------------- inputs
def make_inputs(op: str, shape: tuple[int, int, int, int], device: torch.device, seed: int = 0) -> Inputs:
    """Fresh random inputs of `op` for a [D0, B, N, C] shape, float32.

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
        return {"x": randn(d0, b, n, c), "mean": randn(d0, b, n, c), "std": std}
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


def _with_backward(forward: Callable[[Inputs], tuple]) -> Callable[[Inputs], torch.Tensor]:
    """Loss and its gradient w.r.t. logp: what one policy update step needs."""

    def step(t: Inputs) -> torch.Tensor:
        t["logp"].grad = None
        loss = forward(t)[0]
        loss.backward()
        return t["logp"].grad

    return step


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


# ---------------------------------------------------------------- the fused margrpo ops
def _fused(op: str) -> Callable[[Inputs], object]:
    import margrpo.ops as ops

    if op == "gaussian_logprob":
        return lambda t: ops.gaussian_logprob(t["x"], t["mean"], t["std"], reduce="sum")
    if op == "trajectory_std+topk_mask":
        # check_finite=False: the scores come from a std, the hot path skips the NaN scan
        return lambda t: ops.topk_mask(ops.trajectory_std(t["samples"]), ratio=TOPK_RATIO, check_finite=False)
    if op == "consistency_mask":
        return lambda t: ops.consistency_mask(t["prev"], t["cur"], t["final"], threshold=THRESHOLD)
    return lambda t: ops.grpo_surrogate(
        t["logp"], t["old_logp"], t["advantages"], t["mask"], clip_eps=CLIP_EPS, mte_mask=t["mte_mask"]
    )


def _kernel_level(op: str) -> Callable[[Inputs], object]:
    """The same computation as the fused op, calling torch.ops.margrpo.* on the kernel layouts of
    docs/CONTRACTS.md directly: the kernels' cost without the public op layer's Python."""
    k = torch.ops.margrpo

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1, t.shape[-1])

    if op == "gaussian_logprob":
        return lambda t: k.gaussian_logprob_fwd(flat(t["x"]), flat(t["mean"]), flat(t["std"]), 1).reshape(
            t["x"].shape[:-1]
        )
    if op == "trajectory_std+topk_mask":

        def std_topk(t: Inputs) -> torch.Tensor:
            s = t["samples"]
            scores = k.trajectory_std_fwd(s.reshape(s.shape[0], -1, s.shape[-1])).reshape(s.shape[1:-1])
            return k.topk_mask_fwd(scores, math.floor(TOPK_RATIO * scores.shape[-1]))

        return std_topk
    if op == "consistency_mask":
        return lambda t: k.consistency_mask_fwd(flat(t["prev"]), flat(t["cur"]), flat(t["final"]), THRESHOLD).reshape(
            t["cur"].shape[:-1]
        )

    def surrogate(t: Inputs) -> torch.Tensor:
        mask = t["mask"].float()
        weights = mask / mask.sum().clamp_min(1.0)  # token_mean aggregation
        logp = t["logp"].detach()
        return k.grpo_surrogate_fwd(logp, t["old_logp"], t["advantages"], weights, t["mte_mask"], CLIP_EPS, CLIP_EPS)[2]

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
    """impl name -> callable(inputs) for `op` on `device`: eager, compile, margrpo[<backend>] (the
    public op) and kernel[cpp|cuda] (the extension's kernels called directly)."""
    eager = _EAGER[op]
    impls: dict[str, Callable[[Inputs], object]] = {}
    needs_grad = op == "grpo_surrogate"
    impls["eager"] = _with_backward(eager) if needs_grad else eager
    if op in _MAR_STYLE:
        impls["eager[MAR-style]"] = _MAR_STYLE[op]
    if compile:
        compiled = torch.compile(eager, dynamic=False)
        impls["compile"] = _with_backward(compiled) if needs_grad else compiled
    for backend in _backends_on(device):
        fused = _fused(op)

        def call(t: Inputs, fused=fused, backend=backend) -> object:
            import margrpo.ops as ops

            with ops.use_backend(backend):
                return fused(t)

        impls[f"margrpo[{backend}]"] = _with_backward(call) if needs_grad else call
        if backend in ("cpp", "cuda"):
            impls[f"kernel[{backend}]"] = _kernel_level(op)  # grpo: the kernel returns the gradient itself
    return impls


def assert_agrees(op: str, got: object, expected: object) -> None:
    """Raise AssertionError unless an implementation's output matches eager's (timing a wrong result
    means nothing). Masks may differ on a few positions whose margin is within float rounding."""
    if op in ("trajectory_std+topk_mask", "consistency_mask"):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == torch.bool
        mismatch = (got != expected).float().mean().item()
        assert mismatch <= 1e-3, f"{op}: {mismatch:.2%} of the mask differs from eager"
        return
    # gaussian_logprob: log-densities; grpo_surrogate: d loss / d logp
    atol = 1e-3 if op == "gaussian_logprob" else 1e-9
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-4, atol=atol, msg=lambda m: f"{op}: {m}")


@dataclass
class Row:
    op: str
    shape: str
    dims: list[int]
    impl: str
    device: str
    median_ms: float
    min_ms: float
    speedup: float  # eager median / this median (side by side in one run)


def run(
    ops: tuple[str, ...] = OPS,
    shapes: tuple[str, ...] = tuple(SHAPES),
    device: str | torch.device = "cpu",
    compile: bool = True,
    min_time_s: float = 0.3,
    log: Callable[[str], None] | None = None,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Time every implementation of every op on every shape; the rows carry speedups over eager.
    on_row(row) is called as each row is measured."""
    device = torch.device(device)
    for name in shapes:
        if name not in SHAPES:
            raise ValueError(f"shapes: got {name!r}, expected names from {', '.join(SHAPES)}")
    rows: list[Row] = []
    for op in ops:
        impls = implementations(op, device, compile=compile)
        for shape_name in shapes:
            dims = SHAPES[shape_name]
            inputs = make_inputs(op, dims, device)
            expected = impls["eager"](inputs)
            for impl, fn in impls.items():
                assert_agrees(op, fn(inputs), expected)
            times = interleaved_ms({impl: (lambda fn=fn: fn(inputs)) for impl, fn in impls.items()}, device, min_time_s)
            eager_median = times["eager"][0]
            for impl, (median, fastest) in times.items():
                if log:
                    log(f"{op:<26} {shape_name:<11} {impl:<16} {median:10.3f} ms (min {fastest:.3f})")
                rows.append(Row(op, shape_name, list(dims), impl, device.type, median, fastest, eager_median / median))
                if on_row:
                    on_row(rows[-1])
    return rows


def format_table(rows: list[Row]) -> str:
    """A markdown table: op, shape, impl, median, min, speedup vs eager (medians)."""
    lines = ["| op | shape | impl | median (ms) | min (ms) | speedup vs eager |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        dims = "x".join(str(d) for d in r.dims)
        lines.append(
            f"| {r.op} | {r.shape} [{dims}] | {r.impl} | {r.median_ms:.3f} | {r.min_ms:.3f} | {r.speedup:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: `margrpo bench ops` / `python -m margrpo.bench.ops`; prints the table, optionally JSON."""
    parser = argparse.ArgumentParser(prog="margrpo bench ops", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per measurement")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the CPU run (default: torch's)")
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = JsonReport(args.json, device)
    rows = run(
        split_choices(args.ops, OPS, "ops"),
        split_choices(args.shapes, tuple(SHAPES), "shapes"),
        device,
        compile=not args.no_compile,
        min_time_s=args.min_time,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        on_row=lambda row: report.add(asdict(row)),
    )
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
