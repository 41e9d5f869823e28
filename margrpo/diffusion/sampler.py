"""The sampler interface shared by DDPM and flow samplers (docs/CONTRACTS.md, "Diffusion samplers").

A sampler turns a head's output at step i into the Gaussian transition x_t -> x_prev:
mean and std from per-step coefficients precomputed once (float64), then x_prev = mean + std * noise
and logp = sum over channels of log N(x_prev; mean, std^2). Step i = 0 is the noisiest step.
Means, stds and log-probs are computed in float32 (float64 stays float64) whatever the head's dtype.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np
import torch

from margrpo import ops
from margrpo.ops import oracle


class StepOutput(NamedTuple):
    """One sampler step. x_prev [..., C] in x_t's dtype; mean [..., C] and logp [...] in float32
    (float64 for float64 inputs); std broadcastable to x_t (zeros when the step added no noise)."""

    x_prev: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    logp: torch.Tensor


def transition_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) summed over the last dim: x, mean [..., C]; std > 0 broadcastable to x
    with a last dim of 1 or C. -> [...]. The one place the samplers evaluate a Gaussian density.
    std <= 0 is an error on the CPU; on a GPU the rollout stays sync-free (check_std=False: NaN there)."""
    return ops.gaussian_logprob(x, mean, std, reduce="sum", check_std=x.device.type == "cpu")


class Sampler:
    """Base of the samplers: validation, step(), logprob() and the deterministic-step bookkeeping.

    A subclass sets `num_steps`, `_deterministic` (bool numpy [T]) and `_model_times` (float64 [T]),
    and implements `_mean_std(output, x_t, i, temperature)` (acc-dtype tensors, channels already
    checked) and `_predict_x0(output, x_t, i)`.
    """

    num_steps: int
    _deterministic: np.ndarray
    _model_times: np.ndarray
    # the per-step arrays a step reads, as tuples of Python numbers (`_keep_host_tables`)
    _host: dict[str, tuple]

    # ------------------------------------------------------------------ per-step facts
    def model_time(self, i: int) -> float:
        """The value the head's time embedding receives at step i."""
        return self._host["model_times"][self._check_step(i)]

    @property
    def model_times(self) -> torch.Tensor:
        """Head time values of all steps, float64 [T], in sampling order."""
        return torch.from_numpy(self._model_times.copy())

    def model_times_on(self, device: torch.device | str) -> torch.Tensor:
        """Head time values of all steps as float32 [T] on `device` (the dtype a Python time becomes in
        the heads), copied there on the first call per device and cached: a loop over diffusion steps
        then reads element i with no host-to-device copy (and no sync) per step."""
        cache = self.__dict__.setdefault("_times_on_device", {})
        device = torch.device(device)
        if device not in cache:
            cache[device] = torch.tensor(self._model_times, dtype=torch.float32, device=device)
        return cache[device]

    def out_channels(self, channels: int) -> int:
        """Channels the head must output for a C-channel token."""
        return channels

    def is_deterministic(self, i: int) -> bool:
        """True when step i adds no noise (std exactly 0): its transition has no likelihood."""
        return self._host["deterministic"][self._check_step(i)]

    def stochastic_steps(self) -> list[int]:
        """The steps whose recorded transitions carry a likelihood (std > 0), in sampling order."""
        return [i for i in range(self.num_steps) if not self._deterministic[i]]

    # ------------------------------------------------------------------ transitions
    def predict_x0(self, model_output: torch.Tensor, x_t: torch.Tensor, i: int) -> torch.Tensor:
        """The clean sample implied by the head's output at step i ([..., C], acc dtype)."""
        output, x = self._prepare(model_output, x_t, i)
        return self._predict_x0(output, x, i)

    def mean_std(self, model_output: torch.Tensor, x_t: torch.Tensor, i: int, temperature: float = 1.0):
        """(mean [..., C], std broadcastable to x_t) of the policy's transition at step i; std is 0
        on deterministic steps. Differentiable in model_output."""
        _check_temperature(temperature)
        output, x = self._prepare(model_output, x_t, i)
        return self._mean_std(output, x, i, float(temperature))

    def step(
        self,
        model_output: torch.Tensor,
        x_t: torch.Tensor,
        i: int,
        noise: torch.Tensor | None,
        temperature: float = 1.0,
    ) -> StepOutput:
        """x_prev = mean + std * noise. noise [..., C] standard normal, or None for a deterministic
        step (x_prev = mean). A step that adds no noise returns std = 0 and logp = 0."""
        mean, std = self.mean_std(model_output, x_t, i, temperature)
        rows = x_t.shape[:-1]
        if noise is not None and noise.shape != x_t.shape:
            raise ValueError(f"noise: got shape {tuple(noise.shape)}, expected x_t's shape {tuple(x_t.shape)} or None")
        if noise is None or self._adds_no_noise(i, temperature):
            x_prev = mean.to(x_t.dtype)
            zero_logp = torch.zeros(rows, dtype=mean.dtype, device=mean.device)
            return StepOutput(x_prev, mean, torch.zeros_like(std), zero_logp)
        x_prev = (mean + std * noise.to(mean.dtype)).to(x_t.dtype)
        # the density of x_prev exactly as returned, so logprob() on the stored x_prev reproduces it
        logp = transition_logprob(x_prev.to(mean.dtype), mean, std)
        return StepOutput(x_prev, mean, std, logp)

    def logprob(
        self,
        x_prev: torch.Tensor,
        model_output: torch.Tensor,
        x_t: torch.Tensor,
        i: int,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Sum over channels of log N(x_prev; mean, std^2) at step i -> [...] (fp32, fp64 stays).
        Differentiable in model_output. Zeros on steps that add no noise (see stochastic_steps)."""
        if x_prev.shape != x_t.shape:
            raise ValueError(f"x_prev: got shape {tuple(x_prev.shape)}, expected x_t's shape {tuple(x_t.shape)}")
        mean, std = self.mean_std(model_output, x_t, i, temperature)
        if self._adds_no_noise(i, temperature):
            return torch.zeros(x_t.shape[:-1], dtype=mean.dtype, device=mean.device)
        return transition_logprob(x_prev.to(mean.dtype), mean, std)

    # ------------------------------------------------------------------ helpers
    def _adds_no_noise(self, i: int, temperature: float) -> bool:
        return self.is_deterministic(i) or temperature == 0

    def _check_step(self, i) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.num_steps:
            raise ValueError(f"i: got {i!r}, expected a Python int step index in [0, {self.num_steps})")
        return int(i)

    def _prepare(self, model_output: torch.Tensor, x_t: torch.Tensor, i: int):
        """Validate shapes/dtypes and cast both to the accumulation dtype."""
        self._check_step(i)
        for name, tensor in (("model_output", model_output), ("x_t", x_t)):
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.dim() < 1:
                raise ValueError(f"{name}: expected a floating tensor [..., C], got {_describe(tensor)}")
        channels = x_t.shape[-1]
        expected = (*x_t.shape[:-1], self.out_channels(channels))
        if tuple(model_output.shape) != expected:
            raise ValueError(
                f"model_output: got shape {tuple(model_output.shape)}, expected {expected} "
                f"(x_t's leading dims, {self.out_channels(channels)} channels for C={channels})"
            )
        dtype = oracle.acc_dtype(torch.promote_types(model_output.dtype, x_t.dtype))
        return model_output.to(dtype), x_t.to(dtype)

    def _keep_host_tables(self, **arrays: np.ndarray) -> None:
        """Keep each per-step array also as a tuple of Python numbers, `self._host[name][i]`, which
        the step functions read: torch.compile takes a Python number as a constant, while it traces a
        NumPy element as a tensor and breaks the graph where float() or `if` reads it (the values
        are the same: float(array[i]) == array.tolist()[i])."""
        self._host = {name: tuple(values.tolist()) for name, values in arrays.items()}
        self._host["deterministic"] = tuple(bool(v) for v in self._deterministic)
        self._host["model_times"] = tuple(float(v) for v in self._model_times)

    def _mean_std(self, output, x, i: int, temperature: float):  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_x0(self, output, x, i: int):  # pragma: no cover - abstract
        raise NotImplementedError


def scalar_std(value: float, temperature: float, like: torch.Tensor) -> torch.Tensor:
    """A per-step std as a tensor of shape [1] * like.dim() (broadcastable, no copy per token)."""
    return torch.full((1,) * like.dim(), value * temperature, dtype=like.dtype, device=like.device)


def check_train_inputs(x0: torch.Tensor, noise: torch.Tensor, t_train: torch.Tensor, floating: bool) -> None:
    """Shared checks of add_noise / training_target: noise like x0, t_train (float sigmas or integer
    training steps) shaped like leading dims of x0."""
    if noise.shape != x0.shape:
        raise ValueError(f"noise: got shape {tuple(noise.shape)}, expected x0's shape {tuple(x0.shape)}")
    if (
        not isinstance(t_train, torch.Tensor)
        or t_train.is_floating_point() != floating
        or t_train.dtype == torch.bool
        or t_train.dim() >= x0.dim()
        or tuple(t_train.shape) != tuple(x0.shape[: t_train.dim()])
    ):
        expected = "float sigmas" if floating else "integer training steps"
        raise ValueError(f"t_train: got {_describe(t_train)}, expected {expected} shaped like leading dims of x0 {tuple(x0.shape[:-1])}")


def per_token(values: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """values shaped like leading dims of x0 -> trailing singleton dims added, x0's accumulation dtype."""
    return values.to(oracle.acc_dtype(x0.dtype)).reshape(*values.shape, *([1] * (x0.dim() - values.dim())))


def _check_temperature(temperature) -> None:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, numbers.Real)
        or not (math.isfinite(temperature) and float(temperature) >= 0)
    ):
        raise ValueError(f"temperature: got {temperature!r}, expected a finite float >= 0")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__
