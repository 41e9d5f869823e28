"""Noise schedules over the training steps and the respacing of them to T sampling steps.

Everything here is float64 numpy, computed once when a sampler is built. Two respacing families:
- IDDPM / MAR / Harmon `space_timesteps`: section counts such as "25", "10,15,20" or "ddim25".
- diffusers DDPMScheduler `timestep_spacing`: "leading" (with steps_offset), "trailing", "linspace".
Timestep lists are returned in sampling order: the noisiest kept training step first.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2", "cosine")
DIFFUSERS_SPACINGS = ("leading", "trailing", "linspace")
# the largest beta of the cosine schedule: keeps the last training step away from alpha_bar = 0
COSINE_MAX_BETA = 0.999


def cosine_alpha_bar(t: np.ndarray) -> np.ndarray:
    """IDDPM's unnormalised alpha_bar(t) = cos^2((t + 0.008) / 1.008 * pi / 2) for t in [0, 1]."""
    return np.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


def make_betas(schedule: str, num_train_timesteps: int = 1000, beta_start: float = 1e-4, beta_end: float = 0.02) -> np.ndarray:
    """Training betas [N] (float64) of a named schedule.

    linear: linspace(beta_start, beta_end); scaled_linear: linspace(sqrt start, sqrt end)^2 (Stable
    Diffusion); squaredcos_cap_v2 / cosine: IDDPM cosine, beta_k = min(1 - abar((k+1)/N) / abar(k/N),
    0.999), which ignores beta_start/end.
    """
    _check_positive_int("num_train_timesteps", num_train_timesteps)
    n = num_train_timesteps
    if schedule == "linear":
        betas = np.linspace(beta_start, beta_end, n, dtype=np.float64)
    elif schedule == "scaled_linear":
        betas = np.linspace(beta_start**0.5, beta_end**0.5, n, dtype=np.float64) ** 2
    elif schedule in ("squaredcos_cap_v2", "cosine"):
        t = np.arange(n + 1, dtype=np.float64) / n
        abar = cosine_alpha_bar(t)
        betas = np.minimum(1.0 - abar[1:] / abar[:-1], COSINE_MAX_BETA)
    else:
        raise ValueError(f"beta_schedule: got {schedule!r}, expected one of {', '.join(BETA_SCHEDULES)}")
    check_betas(betas, "beta_schedule")
    return betas


def check_betas(betas: np.ndarray, name: str) -> None:
    """Betas must be a 1-D array in (0, 1] for alpha_bar to be a valid decreasing product."""
    if betas.ndim != 1 or betas.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence of betas, got shape {betas.shape}")
    if not np.all((betas > 0) & (betas <= 1)):
        raise ValueError(f"{name}: every beta must lie in (0, 1], got min {betas.min()} and max {betas.max()}")


def space_timesteps(num_train_timesteps: int, section_counts: str | Sequence[int]) -> list[int]:
    """IDDPM respacing: the kept training steps, noisiest first.

    section_counts "a,b,c" (or a list) splits the N steps into equal sections and takes a, b, c
    evenly strided steps (rounded, Python's round) from them; "ddimK" takes range(0, N, s) with
    the integer stride s that yields exactly K steps.
    """
    _check_positive_int("num_train_timesteps", num_train_timesteps)
    n = num_train_timesteps
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            desired = _parse_int("section_counts", section_counts[len("ddim") :], section_counts)
            for s in range(1, n):
                if len(range(0, n, s)) == desired:
                    return sorted(range(0, n, s), reverse=True)
            raise ValueError(f"section_counts: got {section_counts!r}; no integer stride gives exactly {desired} of {n} steps")
        counts = [_parse_int("section_counts", part, section_counts) for part in section_counts.split(",")]
    else:
        counts = [int(c) for c in section_counts]
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"section_counts: got {section_counts!r}, expected positive step counts")
    size_per, extra = divmod(n, len(counts))
    kept: list[int] = []
    start = 0
    for index, count in enumerate(counts):
        size = size_per + (1 if index < extra else 0)
        if size < count:
            raise ValueError(f"section_counts: got {section_counts!r}; cannot take {count} steps from a section of {size}")
        stride = 1.0 if count <= 1 else (size - 1) / (count - 1)
        position = 0.0
        for _ in range(count):
            kept.append(start + round(position))
            position += stride
        start += size
    return sorted(set(kept), reverse=True)


def diffusers_timesteps(num_train_timesteps: int, num_steps: int, spacing: str, steps_offset: int = 0) -> list[int]:
    """diffusers DDPMScheduler.set_timesteps: the kept training steps, noisiest first.

    leading: k * (N // T) + steps_offset; trailing: round(arange(N, 0, -N / T)) - 1;
    linspace: round(linspace(0, N - 1, T)). steps_offset applies to leading only (as in diffusers).
    """
    _check_positive_int("num_train_timesteps", num_train_timesteps)
    _check_positive_int("num_steps", num_steps)
    n, t = num_train_timesteps, num_steps
    if spacing == "leading":
        steps = (np.arange(t) * (n // t)).round().astype(np.int64) + steps_offset
    elif spacing == "trailing":
        steps = np.round(np.arange(n, 0, -n / t)).astype(np.int64) - 1
    elif spacing == "linspace":
        steps = np.linspace(0, n - 1, t).round().astype(np.int64)
    else:
        raise ValueError(f"spacing: got {spacing!r}, expected one of {', '.join(DIFFUSERS_SPACINGS)}")
    steps = sorted(steps.tolist(), reverse=True)
    check_timesteps(steps, n, f"spacing={spacing!r} with num_steps={t}, steps_offset={steps_offset}")
    return steps


def check_timesteps(timesteps: Sequence[int], num_train_timesteps: int, what: str) -> None:
    """Kept steps must be distinct, strictly decreasing and inside [0, N)."""
    if len(timesteps) == 0:
        raise ValueError(f"{what}: produced no timesteps")
    if any(a <= b for a, b in zip(timesteps, timesteps[1:])):
        raise ValueError(f"{what}: timesteps must be distinct and decreasing, got {list(timesteps)}")
    if timesteps[-1] < 0 or timesteps[0] >= num_train_timesteps:
        raise ValueError(f"{what}: timesteps must lie in [0, {num_train_timesteps}), got {timesteps[-1]}..{timesteps[0]}")


def respaced_betas(alphas_cumprod: np.ndarray, timesteps: Sequence[int]) -> np.ndarray:
    """Betas of the respaced chain, in sampling order: beta_i = 1 - abar[t_i] / abar[t_{i+1}], with
    abar = 1 after the last (least noisy) kept step. Keeps alpha_bar exactly at the kept steps."""
    abar = alphas_cumprod[np.asarray(timesteps)]
    abar_prev = np.append(abar[1:], 1.0)
    return 1.0 - abar / abar_prev


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: got {value!r}, expected a positive int")


def _parse_int(name: str, text: str, whole) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: got {whole!r}, expected comma-separated step counts or 'ddimK'") from None
