"""`margrpo bench <suite>`: dispatch to the benchmark suites (each prints a table)."""

from __future__ import annotations

import importlib
import sys

SUITES = {
    "ops": "margrpo.bench.ops",
    "denoise": "margrpo.bench.denoise",
    "rollout": "margrpo.bench.rollout",
    "rewards": "margrpo.bench.rewards",
    "step": "margrpo.bench.step",
    "host": "margrpo.bench.host",
    "head-compile": "margrpo.bench.head_compile",
    "nova-profile": "margrpo.bench.nova_profile",
    "nova-flops": "margrpo.bench.nova_flops",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUITES:
        got = repr(argv[0]) if argv else "nothing"
        print(f"margrpo bench: got {got}, expected one of: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(SUITES[argv[0]]).main(argv[1:]) or 0)
