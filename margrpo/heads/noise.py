"""Noise for the multi-seed denoising chains.

Layout: noise [T + 1, K + 1, N, C]. noise[0] is the initial x_T of each trajectory, noise[i + 1] the
noise of diffusion step i (a sampler ignores it on deterministic steps). Trajectory 0 is the main
rollout chain, 1..K the extra seed chains.

Three sources: an explicit tensor, a torch.Generator (torch.randn in that layout), or
`CounterNoise`: every value is a pure function of (seed, image, token, trajectory, step, channel),
so a token's chain is the same whichever other tokens share the batch, on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash on int64 tensors holding values in [0, 2^32).

    Both multipliers are below 2^31, so every product stays below 2^63 (no signed overflow)."""
    h = h ^ (h >> 16)
    h = (h * 0x7FEB352D) & _MASK32
    h = h ^ (h >> 15)
    h = (h * 0x6C8E9CF5) & _MASK32
    return h ^ (h >> 16)


def _absorb(h: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Fold a non-negative integer key (< 2^32) into the running hash h (boost hash_combine, then mix)."""
    return _mix32((h ^ (value + _GOLDEN32 + ((h << 6) & _MASK32) + (h >> 2))) & _MASK32)


def _unit_uniform(h: torch.Tensor) -> torch.Tensor:
    """32-bit hash -> float64 in (0, 1), never 0 (safe for log)."""
    return (h.to(torch.float64) + 0.5) / 4294967296.0


def counter_normal(
    seed: int, image: torch.Tensor, token: torch.Tensor, trajectory: torch.Tensor, step: torch.Tensor, channel: torch.Tensor
) -> torch.Tensor:
    """Standard normal float64 values, a pure function of the integer keys (broadcast together).

    Each key is an int64 tensor of values in [0, 2^32); seed is any non-negative int < 2^64.
    Box-Muller on two 32-bit uniforms hashed from the keys and a lane index."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed: got {seed}, expected an integer in [0, 2^64)")
    keys = (image, token, trajectory, step, channel)
    for name, key in zip(("image", "token", "trajectory", "step", "channel"), keys):
        if key.dtype != torch.int64:
            raise TypeError(f"{name}: got dtype {key.dtype}, expected torch.int64")
    device = image.device
    h = _mix32(torch.tensor(seed & _MASK32, dtype=torch.int64, device=device))
    h = _absorb(h, torch.tensor(seed >> 32, dtype=torch.int64, device=device))
    for key in keys:
        h = _absorb(h, key & _MASK32)
    u1 = _unit_uniform(_absorb(h, torch.zeros((), dtype=torch.int64, device=device)))
    u2 = _unit_uniform(_absorb(h, torch.ones((), dtype=torch.int64, device=device)))
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class CounterNoise:
    """Counter-based noise for N token rows: `image[n]` and `token[n]` identify row n (int64 [N])."""

    seed: int
    image: torch.Tensor
    token: torch.Tensor

    def __post_init__(self):
        if self.image.dim() != 1 or self.image.shape != self.token.shape:
            raise ValueError(
                f"image/token: got shapes {tuple(self.image.shape)} and {tuple(self.token.shape)}, expected two int64 vectors of length N"
            )

    def sample(self, num_steps: int, num_trajectories: int, channels: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[num_steps + 1, num_trajectories, N, channels] of the layout above, on image's device."""
        device = self.image.device
        step = torch.arange(num_steps + 1, device=device)[:, None, None, None]
        trajectory = torch.arange(num_trajectories, device=device)[None, :, None, None]
        image = self.image.to(torch.int64)[None, None, :, None]
        token = self.token.to(torch.int64)[None, None, :, None]
        channel = torch.arange(channels, device=device)[None, None, None, :]
        return counter_normal(self.seed, image, token, trajectory, step, channel).to(dtype)


def resolve_noise(
    noise, generator: torch.Generator | None, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The noise tensor of `shape` = (T + 1, K + 1, N, C) from a tensor, a CounterNoise or a generator."""
    if isinstance(noise, CounterNoise):
        if noise.image.shape[0] != shape[2]:
            raise ValueError(f"noise: CounterNoise has {noise.image.shape[0]} rows, expected N = {shape[2]}")
        return noise.sample(shape[0] - 1, shape[1], shape[3], dtype).to(device)
    if isinstance(noise, torch.Tensor):
        if tuple(noise.shape) != shape:
            raise ValueError(
                f"noise: got shape {tuple(noise.shape)}, expected {shape} = [T + 1, K + 1, N, C] "
                "(index 0: initial x_T, index i + 1: noise of diffusion step i)"
            )
        return noise.to(device=device, dtype=dtype)
    if noise is not None:
        raise TypeError(f"noise: got {type(noise).__name__}, expected None, a tensor or a CounterNoise")
    gen_device = generator.device if generator is not None else device
    return torch.randn(shape, generator=generator, dtype=dtype, device=gen_device).to(device)
