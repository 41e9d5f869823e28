"""Reward throughput: images per second of every reward at one batch size.

Each weighted reward is built from random-init weights in its official layout (margrpo.rewards.synthetic:
`tiny` configs for CPU runs, `full` published sizes for the GPU), loaded through its real loading
code, warmed up, then called on fresh random images; the median over the timed calls is reported.
`shapes` scores ShapesWorld scenes at the testbed's resolution (32 px). `remote:<reward>` serves that
reward on a loopback RewardServer and scores through RemoteReward, so its row minus the local row is
the service overhead (encoding, HTTP, decoding).

    python -m margrpo.bench.rewards --device cpu --size tiny --batch 16
    margrpo bench rewards --device cuda --size full --json rewards-gpu.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from margrpo.bench.machine import JsonReport
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
    median_ms: float
    images_per_s: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(name: str, root: Path, size: str, device: torch.device, dtype: str):
    """The reward `name` (weights written under root when it needs them) and a cleanup callable."""
    if name.startswith("remote:"):
        local, _ = _build(name.split(":", 1)[1], root, size, device, dtype)
        server = RewardServer({"served": local}, port=0).start()
        return RemoteReward(url=server.url, remote_name="served", timeout=600, retries=0), server.stop
    if name in WEIGHT_FREE:
        return build_reward(name, device="cpu"), lambda: None
    # drawn on the benchmark's device and stored in its dtype: random weights ready in seconds
    options = synthetic.write(name, root / name, size, device=device, dtype=dtype)
    return build_reward(name, device=str(device), dtype=dtype, **options), lambda: None


def measure(name: str, size: str, device: torch.device, dtype: str, batch: int, image_size: int,
            repeats: int, root: Path) -> Row:
    """Median time of scoring one batch with reward `name`."""
    reward, cleanup = _build(name, root, size, device, dtype)
    try:
        g = torch.Generator().manual_seed(0)
        images = torch.rand(batch, 3, image_size, image_size, generator=g).to(device)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        metadata = [METADATA[i % len(METADATA)] for i in range(batch)]
        if name == "shapes":  # ShapesWorld scenes at the testbed's own resolution
            from margrpo.testbed.grammar import enumerate_prompts
            from margrpo.testbed.render import render_batch
            from margrpo.testbed.world import IMAGE_SIZE

            image_size = IMAGE_SIZE
            prompts = [enumerate_prompts("single")[i] for i in range(batch)]
            images = render_batch(prompts, 0, image_size).to(device)
        reward(images, prompts, metadata)  # warm-up (lazy init, kernel selection, caches)
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            reward(images, prompts, metadata)
            _sync(device)
            times.append(time.perf_counter() - start)
    finally:
        cleanup()
    median = statistics.median(times)
    return Row(name, size if name.split(":")[-1] in WEIGHTED else "-", device.type, dtype, batch, image_size,
               round(median * 1e3, 2), round(batch / median, 1))


def format_table(rows: list[Row]) -> str:
    header = f"{'reward':<28} {'size':<5} {'device':<6} {'dtype':<9} {'batch':>5} {'px':>5} {'ms/batch':>10} {'images/s':>9}"
    lines = [header, "-" * len(header)]
    lines += [f"{r.reward:<28} {r.size:<5} {r.device:<6} {r.dtype:<9} {r.batch:>5} {r.image_size:>5} "
              f"{r.median_ms:>10.1f} {r.images_per_s:>9.1f}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: `margrpo bench rewards` / `python -m margrpo.bench.rewards`; prints the table, optionally JSON."""
    parser = argparse.ArgumentParser(prog="margrpo bench rewards", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=synthetic.SIZES, default="tiny", help="tiny configs or published sizes")
    parser.add_argument("--dtype", default="float32", help="dtype of the reward models (e.g. bfloat16 on GPU)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=512, help="side of the square input images")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per reward (median reported)")
    parser.add_argument("--rewards", default=",".join(REWARDS), help="comma-separated subset of: " + ", ".join(REWARDS))
    parser.add_argument("--json", help="write the rows and the machine description to this file")
    args = parser.parse_args(argv)
    names = [n for n in args.rewards.split(",") if n]
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise SystemExit(f"--rewards: got {', '.join(unknown)}, expected names from {', '.join(REWARDS)}")
    device = torch.device(args.device)
    report = JsonReport(args.json, device)  # rewritten after every reward
    rows = []
    started = time.perf_counter()
    for name in names:
        print(f"bench rewards: {name} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:  # each reward's weights removed after its row
            rows.append(measure(name, args.size, device, args.dtype, args.batch, args.image_size, args.repeats,
                                Path(tmp)))
        report.add(asdict(rows[-1]))
        print(f"bench rewards: {name}: {rows[-1].median_ms} ms per batch, at {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
