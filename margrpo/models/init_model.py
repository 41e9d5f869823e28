"""`margrpo init-model PRESET OUT_DIR`: a random-init backbone written in its family's official layout,
to try a family without its released weights:

    margrpo init-model nova-tiny /tmp/nova-tiny
    margrpo train --config configs/nova-512.yaml backbone.checkpoint=/tmp/nova-tiny ...

Presets (random init, seeded by --seed):
    shapes-tiny-random   the tiny ShapesWorld MAR (TinyMARConfig defaults), before pretraining
    nova-tiny, nova-tiny-flow, nova-0.6b-random       margrpo.models.nova.presets
    harmon-tiny, harmon-1.5b-random                   margrpo.models.harmon.presets
The real-size ones are large (nova-0.6b-random ~2.5 GB with its SD VAE, harmon-1.5b-random ~7 GB in
float32); the tiny ones take a second. A random model generates noise: it is for trying the
pipeline (and measuring it), not for images.
"""

from __future__ import annotations

import argparse

import torch

from margrpo.config import ConfigError

from .directories import save_backbone, write_directory

# preset -> backbone family (the `backbone.name` that loads what it writes)
PRESETS = {
    "shapes-tiny-random": "tiny",
    "nova-tiny": "nova",
    "nova-tiny-flow": "nova",
    "nova-0.6b-random": "nova",
    "harmon-tiny": "harmon",
    "harmon-1.5b-random": "harmon",
}


def build_preset(name: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """The random-init backbone of preset `name` (on the CPU, in eval mode)."""
    if name not in PRESETS:
        raise ConfigError(f"PRESET: got {name!r}, expected one of {', '.join(PRESETS)}")
    family = PRESETS[name]
    if family == "tiny":
        from .tiny import TinyMAR

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return TinyMAR().to(dtype).eval()
    if family == "nova":
        from . import nova

        return nova.build(name, "cpu", dtype, seed)
    from . import harmon

    with torch.random.fork_rng(devices=[]):  # harmon.build seeds the global generator
        return harmon.build(name, seed=seed, dtype=dtype)


def init_model(name: str, out, seed: int = 0, dtype: str = "float32", force: bool = False):
    """Write preset `name` (random init from `seed`) to `out` in its family's layout; returns the path."""
    if name not in PRESETS:
        raise ConfigError(f"PRESET: got {name!r}, expected one of {', '.join(PRESETS)}")
    model = build_preset(name, seed, getattr(torch, dtype))
    return write_directory(out, lambda tmp: save_backbone(model, tmp), force=force)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="margrpo init-model",
        description="Write a random-init backbone in its family's official layout.",
        epilog="presets: " + ", ".join(f"{name} ({family})" for name, family in PRESETS.items()),
    )
    parser.add_argument("preset", metavar="PRESET", help=f"one of: {', '.join(PRESETS)}")
    parser.add_argument("out", metavar="OUT_DIR", help="directory to write (new or empty, or any with --force)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random init (default 0)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--force", action="store_true", help="replace a non-empty OUT_DIR")
    args = parser.parse_args(argv)
    try:
        out = init_model(args.preset, args.out, args.seed, args.dtype, args.force)
    except FileExistsError as err:
        raise ConfigError(f"OUT_DIR: {err}") from err
    family = PRESETS[args.preset]
    print(f"wrote {args.preset} (random init, seed {args.seed}) to {out}; load it with backbone.name={family} backbone.checkpoint={out}")
    return 0
