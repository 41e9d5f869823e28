"""Per-sample random streams: every image of every rank draws its order and noise from its own
torch.Generator, seeded from (base_seed, rank, prompt index, sample index).

So a rollout is reproduced exactly by its seeds, whatever else shares the batch, and no two samples
(across prompts, group members or ranks) share noise. The reference code seeds one global RNG
identically on every rank (docs/METHOD.md section 5); this module is the fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

_SEED_BITS = 63  # torch.Generator.manual_seed accepts any non-negative int64


def sample_seed(base_seed: int, rank: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed for one sample, a hash of its four coordinates (distinct coordinates give
    statistically independent seeds; nearby integers do not give correlated streams)."""
    for name, value in (("base_seed", base_seed), ("rank", rank), ("prompt_index", prompt_index), ("sample_index", sample_index)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: got {value!r}, expected a non-negative integer")
    key = f"margrpo-rollout:{base_seed}:{rank}:{prompt_index}:{sample_index}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def shared_seed(base_seed: int, rank: int, prompt_index: int) -> int:
    """A 63-bit seed for the randomness a GRPO group shares (its order and the noise outside the
    recorded transitions, margrpo.rollout.generate's `shared_seeds`), independent of every
    sample_seed."""
    for name, value in (("base_seed", base_seed), ("rank", rank), ("prompt_index", prompt_index)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: got {value!r}, expected a non-negative integer")
    key = f"margrpo-group:{base_seed}:{rank}:{prompt_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> (64 - _SEED_BITS)


def group_seeds(base_seed: int, rank: int, prompt_indices: Sequence[int], group_size: int) -> list[int]:
    """Seeds for a GRPO batch laid out prompt-major: for each prompt index, `group_size` samples."""
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size: got {group_size!r}, expected an integer >= 1")
    return [sample_seed(base_seed, rank, p, s) for p in prompt_indices for s in range(group_size)]


def mirror_pairs(num_groups: int, group_size: int) -> list[int]:
    """margrpo.rollout.generate's `mirror` for a prompt-major batch: in every group, sample 2i + 1
    takes the negated recorded noise of sample 2i (group_size must be even)."""
    if not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size: got {group_size!r}, expected an even integer >= 2 (samples pair up)")
    return [-1 if s % 2 == 0 else g * group_size + s - 1 for g in range(num_groups) for s in range(group_size)]


def make_generators(seeds: Sequence[int], device: torch.device | str) -> list[torch.Generator]:
    """One torch.Generator per seed on `device` (streams are reproducible per device type)."""
    generators = []
    for seed in seeds:
        generator = torch.Generator(device=device)
        generator.manual_seed(int(seed))
        generators.append(generator)
    return generators


def plan_seed(seeds: Sequence[int]) -> int:
    """One seed for batch-level choices (which steps to record), a hash of all sample seeds."""
    key = ("margrpo-plan:" + ",".join(str(int(s)) for s in seeds)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> (64 - _SEED_BITS)
