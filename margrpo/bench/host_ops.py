"""Host cost of the public fused ops: one call of margrpo.ops.<op> against the raw kernel call
torch.ops.margrpo.<op>_fwd on inputs already in the kernel layout (docs/CONTRACTS.md).

The difference is the wrapper: argument checks, layout (reshape, dtype), backend dispatch and the
outputs' unpacking. `tiny` tensors make it visible (the kernel does almost nothing); the `nova` shape
[K=3, B=4, N=1024, C=16] gives its share of a real call (the target: at most 10% over the raw call).
The ops run with the extension's cpp backend on CPU tensors, one thread, without autograd (inputs
that do not require grad), on their hot-path settings (check_std=False, check_finite=False). Each
round calls each of public and raw `calls` times, in a shuffled order (margrpo.bench.timing), timed in
this thread's CPU time; per-call microseconds and the per-round ratio public / raw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from margrpo.bench.timing import interleave, stats

SHAPES = {"tiny": (3, 1, 4, 16), "nova": (3, 4, 1024, 16)}
# grpo_surrogate: from a bool mask (the public op builds the token_mean weights, work the raw call is
# spared); grpo_surrogate.weights: the trainer's call, weights given (aggregation "sum");
# grpo_surrogate.floor: no wrapper, only the raw call's outputs made into the public GRPOLoss, the
# least any wrapper with that result pays
OPS = (
    "gaussian_logprob",
    "trajectory_std",
    "topk_mask",
    "consistency_mask",
    "grpo_surrogate",
    "grpo_surrogate.weights",
    "grpo_surrogate.floor",
)
TOPK_RATIO, CLIP_EPS = 0.3, 0.2


def cases(shape: tuple[int, int, int, int], seed: int = 0) -> dict[str, tuple[Callable, Callable]]:
    """op -> (public call, raw kernel call) on fresh random inputs of [D0, B, N, C] = `shape`."""
    import margrpo.ops as ops

    k_ops = torch.ops.margrpo
    g = torch.Generator().manual_seed(seed)
    d0, b, n, c = shape
    x, mean = torch.randn(d0, b, n, c, generator=g), torch.randn(d0, b, n, c, generator=g)
    std = torch.rand(d0, b, n, c, generator=g).add_(0.1)
    rows = (x.reshape(-1, c), mean.reshape(-1, c), std.reshape(-1, c))
    samples = x.reshape(d0, -1, c)
    scores = torch.randn(b, n, generator=g)
    k = math.floor(TOPK_RATIO * n)
    logp = torch.randn(d0, b, n, generator=g) - 30.0
    old = logp + 0.2 * torch.randn(d0, b, n, generator=g)
    adv = torch.randn(b, generator=g)
    mask = torch.rand(b, n, generator=g) < 0.9
    mte = torch.rand(b, n, generator=g) < TOPK_RATIO
    weights = ops.token_weights(mask)  # the raw call takes the weights the public op builds from the mask
    return {
        "gaussian_logprob": (lambda: ops.gaussian_logprob(x, mean, std, check_std=False), lambda: k_ops.gaussian_logprob_fwd(*rows, 1)),
        "trajectory_std": (lambda: ops.trajectory_std(x), lambda: k_ops.trajectory_std_fwd(samples)),
        "topk_mask": (lambda: ops.topk_mask(scores, ratio=TOPK_RATIO, check_finite=False), lambda: k_ops.topk_mask_fwd(scores, k)),
        "consistency_mask": (lambda: ops.consistency_mask(x, mean, std), lambda: k_ops.consistency_mask_fwd(*rows, 0.0)),
        "grpo_surrogate": (
            lambda: ops.grpo_surrogate(logp, old, adv, mask, clip_eps=CLIP_EPS, mte_mask=mte),
            lambda: k_ops.grpo_surrogate_fwd(logp, old, adv, weights, mte, CLIP_EPS, CLIP_EPS),
        ),
        "grpo_surrogate.floor": (
            lambda: ops.GRPOLoss(*k_ops.grpo_surrogate_fwd(logp, old, adv, weights, mte, CLIP_EPS, CLIP_EPS)[:2]),
            lambda: k_ops.grpo_surrogate_fwd(logp, old, adv, weights, mte, CLIP_EPS, CLIP_EPS),
        ),
        "grpo_surrogate.weights": (
            lambda: ops.grpo_surrogate(logp, old, adv, weights, clip_eps=CLIP_EPS, mte_mask=mte, aggregation="sum", check_finite=False),
            lambda: k_ops.grpo_surrogate_fwd(logp, old, adv, weights, mte, CLIP_EPS, CLIP_EPS),
        ),
    }


@dataclass
class OpHostRow:
    op: str
    shape: str
    dims: tuple[int, ...]
    public_us: float  # p50 per call
    raw_us: float
    wrapper_us: float  # public_us - raw_us
    ratio: float  # median over rounds of public / raw, same round
    ratio_p20: float
    ratio_p80: float
    rounds: int


def op_overhead(
    shapes: tuple[str, ...] = ("tiny", "nova"),
    ops: tuple[str, ...] = OPS,
    rounds: int = 15,
    calls: dict[str, int] | None = None,
    order: list | None = None,
) -> list[OpHostRow]:
    """Rows of public vs raw per op and shape (see the module doc); the rounds' orders go to `order`."""
    from margrpo.ops import use_backend

    calls = calls or {"tiny": 300, "nova": 10}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        with use_backend("cpp"), torch.no_grad():
            for label in shapes:
                built = cases(SHAPES[label])
                for op in ops:
                    public, raw = built[op]
                    n = calls[label]

                    def repeated(fn, n=n):
                        def run():
                            for _ in range(n):
                                fn()

                        return run

                    timed = interleave(
                        {"public": repeated(public), "raw": repeated(raw)},
                        torch.device("cpu"),
                        min_time_s=0.0,
                        warmup=2,
                        min_rounds=rounds,
                        max_rounds=rounds,
                        clock=time.thread_time,
                    )
                    if order is not None:
                        order.append({"op": op, "shape": label, "order": timed.order})
                    p, r = timed.stats("public").p50 * 1e3 / n, timed.stats("raw").p50 * 1e3 / n
                    st = stats([pt / rt for pt, rt in zip(timed.times["public"], timed.times["raw"])])
                    rows.append(OpHostRow(op, label, SHAPES[label], p, r, p - r, st.p50, st.p20, st.p80, st.n))
    finally:
        torch.set_num_threads(threads)
    return rows


def format_rows(rows: list[OpHostRow]) -> str:
    lines = [
        "public ops vs raw kernel calls: cpp backend, 1 torch thread, no autograd, this thread's CPU time",
        f"{'op':<18} {'shape':<6} {'public us':>10} {'raw us':>9} {'wrapper us':>11} {'public/raw p50 [p20, p80]':>27}",
    ]
    for r in rows:
        lines.append(
            f"{r.op:<18} {r.shape:<6} {r.public_us:>10.2f} {r.raw_us:>9.2f} {r.wrapper_us:>11.2f} "
            f"{r.ratio:>10.3f} [{r.ratio_p20:.3f}, {r.ratio_p80:.3f}]"
        )
    return "\n".join(lines)
