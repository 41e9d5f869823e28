"""Reward throughput: images per second of every reward at one batch size.

Each weighted reward is built from random-init weights in its official layout (margrpo.rewards.synthetic:
`tiny` configs for CPU runs, `full` published sizes for the GPU), loaded through its real loading
code, warmed up, then called on fresh random images: p20 / p50 / p80 and min of the timed calls
(margrpo.bench.timing), images/s at the median, and the memory of one more call (margrpo.bench.memory).
`shapes` scores ShapesWorld scenes at the testbed's resolution (32 px). `remote:<reward>` serves that
reward on a loopback RewardServer and scores through RemoteReward, so its row minus the local row is
the service overhead (encoding, HTTP, decoding); when both are asked for they share one model and run
interleaved, each round in a shuffled order (recorded in the JSON), and the remote row's `vs_local` is
the median [p20, p80] of the per-round paired ratios local time / remote time.

    python -m margrpo.bench.rewards --device cpu --size tiny --batch 16
    margrpo bench rewards --device cuda --size full --json rewards-gpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from margrpo.bench import memory
from margrpo.bench.machine import JsonReport, header, load_average
from margrpo.bench.timing import Timed, interleave
from margrpo.rewards import RemoteReward, build_reward, synthetic
from margrpo.rewards.server import RewardServer

WEIGHTED = tuple(synthetic.WRITERS)
WEIGHT_FREE = ("jpeg_compressibility", "shapes")
REWARDS = WEIGHTED + WEIGHT_FREE + ("remote:jpeg_compressibility", "remote:hps")
PROMPTS = ["a red cat", "a cat left of a dog", "two dogs", "a dog"]
METADATA = [
    {"task_type": "color", "nouns": ["cat"], "attr_nouns": ["red cat"]},
    {"task_type": "spatial", "nouns": ["cat", "dog"], "spatial_info": {"obj1": "cat", "obj2": "dog", "locality": "left of"}},
    {"task_type": "numeracy", "nouns": ["dog"], "numeracy_info": [{"obj_name": "dog", "num": 2}]},
    {"task_type": "object", "nouns": ["dog"]},
]


@dataclass
class Row:
    reward: str
    size: str
    device: str
    dtype: str
    batch: int
    image_size: int
    median_ms: float  # = p50_ms, rounded
    images_per_s: float  # batch / the median
    p20_ms: float
    p50_ms: float
    p80_ms: float
    min_ms: float
    rounds: int
    vs_local: float | None  # median over rounds of the local reward's time / this one's, same round
    vs_local_p20: float | None
    vs_local_p80: float | None
    mem_mb: float  # margrpo.bench.memory.method(device)


def _build(name: str, root: Path, size: str, device: torch.device, dtype: str):
    """The reward `name`, with random weights written under root when it needs them."""
    if name in WEIGHT_FREE:
        return build_reward(name, device="cpu")
    # drawn on the benchmark's device and stored in its dtype: random weights ready in seconds
    options = synthetic.write(name, root / name, size, device=device, dtype=dtype)
    return build_reward(name, device=str(device), dtype=dtype, **options)


def _served(local) -> tuple[RemoteReward, object]:
    """`local` behind a loopback RewardServer: the RemoteReward client and the server's stop callable."""
    server = RewardServer({"served": local}, port=0).start()
    return RemoteReward(url=server.url, remote_name="served", timeout=600, retries=0), server.stop


def measure(
    names: tuple[str, ...],
    size: str,
    device: torch.device,
    dtype: str,
    batch: int,
    image_size: int,
    repeats: int,
    root: Path,
    groups: list[dict] | None = None,
) -> list[Row]:
    """The rows of one reward, `(name,)` or `("remote:name",)`, or of both `(name, "remote:name")`
    (one model, timed interleaved, the remote row paired with the local one); each round's order is
    appended to `groups`."""
    base = names[0].removeprefix("remote:")
    if any(n.removeprefix("remote:") != base for n in names):
        raise ValueError(f"names: got {names}, expected one reward and/or its remote: form")
    local = _build(base, root, size, device, dtype)
    rewards, stops = {}, []
    for name in names:
        if name.startswith("remote:"):
            rewards[name], stop = _served(local)
            stops.append(stop)
        else:
            rewards[name] = local
    try:
        g = torch.Generator().manual_seed(0)
        images = torch.rand(batch, 3, image_size, image_size, generator=g).to(device)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        metadata = [METADATA[i % len(METADATA)] for i in range(batch)]
        if base == "shapes":  # ShapesWorld scenes at the testbed's own resolution
            from margrpo.testbed.grammar import enumerate_prompts
            from margrpo.testbed.render import render_batch
            from margrpo.testbed.world import IMAGE_SIZE

            image_size = IMAGE_SIZE
            prompts = [enumerate_prompts("single")[i] for i in range(batch)]
            images = render_batch(prompts, 0, image_size).to(device)
        calls = {name: Timed(lambda r=r: r(images, prompts, metadata)) for name, r in rewards.items()}
        # one warm-up call each (lazy init, kernel selection, caches), then interleaved rounds
        timed = interleave(calls, device, min_time_s=0.0, warmup=1, min_rounds=repeats, max_rounds=repeats)
        mem = {name: memory.call_mb(call, device, images) for name, call in calls.items()}
    finally:
        for stop in stops:
            stop()
    if groups is not None:
        groups.append({"rewards": list(names), "rounds": len(timed.order), "order": timed.order})
    rows = []
    for name in names:
        st = timed.stats(name)
        ratio = timed.ratio(base, name) if len(names) > 1 else None  # the local row of a pair: 1.0
        rows.append(
            Row(
                name,
                size if base in WEIGHTED else "-",
                device.type,
                dtype,
                batch,
                image_size,
                round(st.p50, 2),
                round(batch / (st.p50 / 1e3), 1),
                st.p20,
                st.p50,
                st.p80,
                st.min,
                st.n,
                ratio and ratio.p50,
                ratio and ratio.p20,
                ratio and ratio.p80,
                mem[name],
            )
        )
    return rows


def measured_together(names: list[str]) -> list[tuple[str, ...]]:
    """The requested rewards in order, each local reward with its remote: form when both are asked for."""
    units = []
    for name in names:
        base = name.removeprefix("remote:")
        if name.startswith("remote:") and base in names:
            continue  # measured with its local reward
        units.append((name, f"remote:{name}") if f"remote:{name}" in names else (name,))
    return units


def format_table(rows: list[Row]) -> str:
    """One line per reward: times (p50, p20, p80, min) per batch, images/s at the median, the remote
    rows' ratio to the local reward (paired per round) and the memory."""
    head = (
        f"{'reward':<28} {'size':<5} {'device':<6} {'dtype':<9} {'batch':>5} {'px':>5} {'rounds':>6} "
        f"{'p50 ms':>10} {'p20 ms':>10} {'p80 ms':>10} {'min ms':>10} {'images/s':>9} "
        f"{'x local p50 [p20, p80]':>24} {'MB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r.vs_local:.2f} [{r.vs_local_p20:.2f}, {r.vs_local_p80:.2f}]" if r.vs_local is not None else "-"
        lines.append(
            f"{r.reward:<28} {r.size:<5} {r.device:<6} {r.dtype:<9} {r.batch:>5} {r.image_size:>5} "
            f"{r.rounds:>6} {r.p50_ms:>10.1f} {r.p20_ms:>10.1f} {r.p80_ms:>10.1f} {r.min_ms:>10.1f} "
            f"{r.images_per_s:>9.1f} {ratio:>24} {r.mem_mb:>9.3g}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: `margrpo bench rewards` / `python -m margrpo.bench.rewards`; prints the table, optionally JSON."""
    parser = argparse.ArgumentParser(prog="margrpo bench rewards", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=synthetic.SIZES, default="tiny", help="tiny configs or published sizes")
    parser.add_argument("--dtype", default="float32", help="dtype of the reward models (e.g. bfloat16 on GPU)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=512, help="side of the square input images")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls (rounds) per reward")
    parser.add_argument("--rewards", default=",".join(REWARDS), help="comma-separated subset of: " + ", ".join(REWARDS))
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    args = parser.parse_args(argv)
    names = [n for n in args.rewards.split(",") if n]
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise SystemExit(f"--rewards: got {', '.join(unknown)}, expected names from {', '.join(REWARDS)}")
    device = torch.device(args.device)
    report = JsonReport(
        args.json,
        device,
        memory=memory.method(device),  # rewritten after every reward
        vs_local="median [p20, p80] over rounds of the local reward's time / the remote's, same round",
    )
    print(f"{header(report.head['machine'])}\nmemory: {memory.method(device)}", flush=True)
    rows, groups = [], []
    started = time.perf_counter()
    for unit in measured_together(names):
        print(f"bench rewards: {', '.join(unit)} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:  # each reward's weights removed after its rows
            new = measure(unit, args.size, device, args.dtype, args.batch, args.image_size, args.repeats, Path(tmp), groups)
        rows += new
        report.set("groups", groups)
        report.add(*map(asdict, new))
        for row in new:
            print(
                f"bench rewards: {row.reward}: p50 {row.median_ms} ms per batch, at {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    report.set("load_average_end", load_average())
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
