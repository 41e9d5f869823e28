"""Flow-matching sampler: Euler ODE step and the Flow-GRPO SDE step (NOVA flow checkpoints).

Convention (NOVA / diffusers FlowMatchEulerDiscreteScheduler): x_sigma = sigma noise + (1 - sigma) x0,
the head predicts v = noise - x0, sigma runs from 1 down to 0. Step i moves sigma_i -> sigma_{i+1},
dt = sigma_{i+1} - sigma_i < 0.
  ODE: mean = x + v dt, std = 0.
  SDE: sigma_hat = a sqrt(sigma / (1 - sigma)) (at sigma = 1 the denominator uses sigma_1, as
       Flow-GRPO does); mean = x (1 + sigma_hat^2 dt / (2 sigma)) + v (1 + sigma_hat^2 (1 - sigma) /
       (2 sigma)) dt; std = sigma_hat sqrt(-dt) * temperature.
Sampling sigmas follow NOVA's set_timesteps: linspace(1, s(1/N), T) mapped through the shift
s(x) = shift x / (1 + (shift - 1) x), then a final 0; the head receives sigma * N.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .sampler import Sampler, check_train_inputs, per_token, scalar_std

FLOW_MODES = ("sde", "ode")


def shift_sigmas(sigmas: np.ndarray, shift: float) -> np.ndarray:
    """shift s / (1 + (shift - 1) s), written so that s = 1 maps to exactly 1."""
    return shift * sigmas / (shift * sigmas + (1.0 - sigmas))


def flow_sigmas(num_steps: int, shift: float = 1.0, num_train_timesteps: int = 1000, flow_shift: float | None = None) -> np.ndarray:
    """NOVA's sampling sigmas [T + 1] (float64): sigma_0 = 1 ... sigma_{T-1}, then 0.

    As NOVA's scheduler: the range's low end is the scheduler's own `shift` applied to 1/N (fixed at
    construction); the T sigmas spaced linearly over it are then shifted by `flow_shift` (NOVA's
    pipeline argument, scheduler.set_shift), which defaults to `shift`."""
    sigma_min = shift_sigmas(np.array([1.0 / num_train_timesteps]), shift)[0]
    base = np.linspace(1.0, sigma_min, num_steps, dtype=np.float64)
    return np.append(shift_sigmas(base, shift if flow_shift is None else flow_shift), 0.0)


class FlowSDESampler(Sampler):
    """Flow-matching sampler with the Flow-GRPO SDE (mode="sde") or the Euler ODE (mode="ode").

    Args:
        num_steps: T sampling steps.
        noise_level: a in sigma_hat = a sqrt(sigma / (1 - sigma)) (Flow-GRPO and MAR-GRPO use 0.7);
            0 makes the SDE the ODE.
        shift: timestep shift of NOVA's scheduler config (1 = none).
        flow_shift: NOVA's pipeline `flow_shift` (its scheduler.set_shift): the shift of the sampling
            sigmas, while their range keeps `shift`'s low end; None: `shift` (passing a pipeline's
            flow_shift as `shift` instead gives another schedule).
        num_train_timesteps: N; the head's time input is sigma * N.
        mode: "sde" or "ode".
    """

    def __init__(
        self,
        num_steps: int,
        *,
        noise_level: float = 0.7,
        shift: float = 1.0,
        num_train_timesteps: int = 1000,
        mode: str = "sde",
        flow_shift: float | None = None,
    ):
        if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(f"num_steps: got {num_steps!r}, expected a positive int")
        if not _is_real(noise_level) or noise_level < 0:
            raise ValueError(f"noise_level: got {noise_level!r}, expected a finite float >= 0")
        if not _is_real(shift) or shift <= 0:
            raise ValueError(f"shift: got {shift!r}, expected a finite float > 0")
        if flow_shift is not None and (not _is_real(flow_shift) or flow_shift <= 0):
            raise ValueError(f"flow_shift: got {flow_shift!r}, expected None or a finite float > 0")
        if isinstance(num_train_timesteps, bool) or not isinstance(num_train_timesteps, (int, np.integer)) or num_train_timesteps < 1:
            raise ValueError(f"num_train_timesteps: got {num_train_timesteps!r}, expected a positive int")
        if mode not in FLOW_MODES:
            raise ValueError(f"mode: got {mode!r}, expected one of {', '.join(FLOW_MODES)}")
        self.num_steps = int(num_steps)
        self.noise_level = float(noise_level)
        self.shift = float(shift)
        self.num_train_timesteps = int(num_train_timesteps)
        self.mode = mode
        self.flow_shift = None if flow_shift is None else float(flow_shift)
        self.sigmas = flow_sigmas(self.num_steps, self.shift, self.num_train_timesteps, self.flow_shift)
        self._model_times = self.sigmas[:-1] * self.num_train_timesteps
        self._precompute()

    def _precompute(self) -> None:
        sigma, sigma_next = self.sigmas[:-1], self.sigmas[1:]
        dt = sigma_next - sigma
        if self.mode == "ode" or self.noise_level == 0:
            self._coef_x = np.ones_like(sigma)
            self._coef_v = dt
            self._std = np.zeros_like(sigma)
        else:
            # sigma = 1 would divide by zero: Flow-GRPO substitutes the second sigma there
            denominator = 1.0 - np.where(sigma == 1.0, self.sigmas[1], sigma)
            sigma_hat = self.noise_level * np.sqrt(sigma / denominator)
            self._coef_x = 1.0 + sigma_hat**2 * dt / (2.0 * sigma)
            self._coef_v = (1.0 + sigma_hat**2 * (1.0 - sigma) / (2.0 * sigma)) * dt
            self._std = sigma_hat * np.sqrt(-dt)
        self._deterministic = self._std == 0
        self._keep_host_tables(coef_x=self._coef_x, coef_v=self._coef_v, std=self._std, sigma=self.sigmas)

    def _predict_x0(self, output: torch.Tensor, x: torch.Tensor, i: int) -> torch.Tensor:
        return x - self._host["sigma"][i] * output

    def _mean_std(self, output: torch.Tensor, x: torch.Tensor, i: int, temperature: float):
        host = self._host
        mean = host["coef_x"][i] * x + host["coef_v"][i] * output
        return mean, scalar_std(host["std"][i], temperature, x)

    # ------------------------------------------------------------------ training-time forward process
    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t_train: torch.Tensor) -> torch.Tensor:
        """x_sigma = sigma noise + (1 - sigma) x0. t_train: float sigmas in [0, 1] shaped like
        leading dims of x0 (trailing dims broadcast). Returns x0's dtype."""
        sigma = self._train_sigma(x0, noise, t_train)
        return (sigma * noise + (1.0 - sigma) * x0).to(x0.dtype)

    def training_target(self, x0: torch.Tensor, noise: torch.Tensor, t_train: torch.Tensor) -> torch.Tensor:
        """The velocity v = noise - x0 the head regresses (independent of sigma)."""
        self._train_sigma(x0, noise, t_train)
        return noise - x0

    def train_model_time(self, t_train: torch.Tensor) -> torch.Tensor:
        """The head's time input for training sigmas t_train: sigma * N."""
        return t_train.to(torch.float32) * self.num_train_timesteps

    def _train_sigma(self, x0, noise, t_train):
        check_train_inputs(x0, noise, t_train, floating=True)
        if t_train.numel() and (float(t_train.min()) < 0 or float(t_train.max()) > 1):
            raise ValueError(f"t_train: sigmas must lie in [0, 1], got {float(t_train.min())}..{float(t_train.max())}")
        return per_token(t_train, x0)

    def __repr__(self) -> str:
        return f"FlowSDESampler(num_steps={self.num_steps}, mode={self.mode!r}, noise_level={self.noise_level}, shift={self.shift})"


def _is_real(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
