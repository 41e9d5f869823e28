"""DDPM / IDDPM ancestral sampler over a respaced schedule (NOVA's DDPMScheduler, MAR/Harmon's IDDPM).

Per step i (training step t_i, abar = alphas_cumprod[t_i], abar_prev = that of the next kept step or 1):
  beta = 1 - abar / abar_prev                      (respaced beta)
  x0   = (x - sqrt(1 - abar) eps) / sqrt(abar)      (eps);  the output itself (sample);
         sqrt(abar) x - sqrt(1 - abar) v            (v_prediction); then optionally clipped to [-r, r]
  mean = beta sqrt(abar_prev) / (1 - abar) x0 + (1 - abar_prev) sqrt(1 - beta) / (1 - abar) x
  var  = fixed_small: posterior beta (1 - abar_prev) / (1 - abar); fixed_large: beta;
         learned_range: exp(f log beta + (1 - f) log max(posterior, 1e-20)), f = (v + 1) / 2 from the
         head's second C channels. The posterior variance is 0 only at the least noisy step, where
         abar_prev = 1: with the last kept step at t = 0 (IDDPM, diffusers without steps_offset) that
         step is deterministic; with a stochastic last step (steps_offset > 0, trailing spacing) the
         floor is diffusers' (IDDPM would borrow the next step's value, which it never samples with).
  std  = sqrt(var) * temperature; 0 (deterministic) where the kept training step is 0 (IDDPM and
         diffusers add no noise there) or the fixed-small posterior variance is exactly 0.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from . import schedules
from .sampler import Sampler, check_train_inputs, per_token, scalar_std

PREDICTION_TYPES = {
    "epsilon": "epsilon",
    "eps": "epsilon",
    "sample": "sample",
    "x0": "sample",
    "v_prediction": "v_prediction",
    "v": "v_prediction",
}
VARIANCE_TYPES = ("fixed_small", "fixed_large", "learned_range")
SPACINGS = schedules.DIFFUSERS_SPACINGS + ("iddpm", "ddim")


class DDPMSampler(Sampler):
    """Ancestral DDPM sampler with respacing, eps/x0/v outputs and fixed or learned-range variance.

    Args:
        num_steps: T sampling steps.
        num_train_timesteps: N training steps of the schedule (1000).
        beta_schedule: "linear", "scaled_linear", "squaredcos_cap_v2" (alias "cosine").
        beta_start, beta_end: range of the linear schedules.
        trained_betas: explicit training betas [N] (overrides beta_schedule).
        spacing: "leading" | "trailing" | "linspace" (diffusers), "iddpm" (space_timesteps(N, "T")),
            "ddim" (space_timesteps(N, "ddimT")), or an explicit sequence of T kept training steps.
        steps_offset: added to "leading" steps (diffusers semantics).
        prediction_type: "epsilon" ("eps"), "sample" ("x0") or "v_prediction" ("v").
        variance_type: "fixed_small", "fixed_large" or "learned_range" (head outputs 2C channels).
        clip_sample: clip the predicted x0 to [-r, r] with r = clip_sample; None disables.

    Unlike diffusers with "linspace"/"trailing" spacing (whose previous step is t - N // T), the
    previous step is always the next kept step, so the respaced chain keeps alpha_bar exactly.
    """

    def __init__(
        self,
        num_steps: int,
        *,
        num_train_timesteps: int = 1000,
        beta_schedule: str = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        trained_betas: Sequence[float] | None = None,
        spacing: str | Sequence[int] = "leading",
        steps_offset: int = 0,
        prediction_type: str = "epsilon",
        variance_type: str = "fixed_small",
        clip_sample: float | None = None,
    ):
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type: got {prediction_type!r}, expected one of {', '.join(PREDICTION_TYPES)}")
        if variance_type not in VARIANCE_TYPES:
            raise ValueError(f"variance_type: got {variance_type!r}, expected one of {', '.join(VARIANCE_TYPES)}")
        if clip_sample is not None and not (isinstance(clip_sample, (int, float)) and clip_sample > 0):
            raise ValueError(f"clip_sample: got {clip_sample!r}, expected None or a positive clip range")
        self.prediction_type = PREDICTION_TYPES[prediction_type]
        self.variance_type = variance_type
        self.clip_sample = None if clip_sample is None else float(clip_sample)

        if trained_betas is not None:
            betas = np.asarray(trained_betas, dtype=np.float64)
            schedules.check_betas(betas, "trained_betas")
        else:
            betas = schedules.make_betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        self.num_train_timesteps = len(betas)
        self._train_abar = np.cumprod(1.0 - betas)
        self.timesteps = _kept_timesteps(spacing, num_steps, self.num_train_timesteps, steps_offset)
        self.num_steps = len(self.timesteps)
        self._model_times = np.asarray(self.timesteps, dtype=np.float64)
        self._precompute()

    def _precompute(self) -> None:
        """Per-step float64 coefficients, in sampling order (index i)."""
        t = np.asarray(self.timesteps)
        abar = self._train_abar[t]
        abar_prev = np.append(abar[1:], 1.0)
        beta = schedules.respaced_betas(self._train_abar, self.timesteps)
        self.alphas_cumprod = abar
        self.betas = beta
        self._sqrt_abar = np.sqrt(abar)
        self._sqrt_one_minus_abar = np.sqrt(1.0 - abar)
        self._coef_x0 = beta * np.sqrt(abar_prev) / (1.0 - abar)
        self._coef_xt = (1.0 - abar_prev) * np.sqrt(1.0 - beta) / (1.0 - abar)
        self.posterior_variance = beta * (1.0 - abar_prev) / (1.0 - abar)
        # diffusers' floor for the one zero posterior variance (see the module docstring)
        self._min_log = np.log(np.maximum(self.posterior_variance, 1e-20))
        self._max_log = np.log(beta)
        variance = {"fixed_small": self.posterior_variance, "fixed_large": beta}.get(self.variance_type)
        self._fixed_std = None if variance is None else np.sqrt(variance)
        no_noise = t == 0
        if self.variance_type == "fixed_small":
            no_noise |= self.posterior_variance == 0
        self._deterministic = no_noise
        fixed = {} if self._fixed_std is None else {"fixed_std": self._fixed_std}
        self._keep_host_tables(
            sqrt_abar=self._sqrt_abar,
            sqrt_one_minus_abar=self._sqrt_one_minus_abar,
            coef_x0=self._coef_x0,
            coef_xt=self._coef_xt,
            min_log=self._min_log,
            max_log=self._max_log,
            **fixed,
        )

    def out_channels(self, channels: int) -> int:
        """2C for learned_range (eps/x0/v then the variance interpolation), else C."""
        return 2 * channels if self.variance_type == "learned_range" else channels

    def _predict_x0(self, output: torch.Tensor, x: torch.Tensor, i: int) -> torch.Tensor:
        pred = output[..., : x.shape[-1]]
        host = self._host
        if self.prediction_type == "epsilon":
            x0 = (x - host["sqrt_one_minus_abar"][i] * pred) / host["sqrt_abar"][i]
        elif self.prediction_type == "sample":
            x0 = pred
        else:
            x0 = host["sqrt_abar"][i] * x - host["sqrt_one_minus_abar"][i] * pred
        if self.clip_sample is not None:
            x0 = x0.clamp(-self.clip_sample, self.clip_sample)
        return x0

    def _mean_std(self, output: torch.Tensor, x: torch.Tensor, i: int, temperature: float):
        x0 = self._predict_x0(output, x, i)
        host = self._host
        mean = host["coef_x0"][i] * x0 + host["coef_xt"][i] * x
        if host["deterministic"][i]:
            return mean, scalar_std(0.0, temperature, x)
        if self._fixed_std is not None:
            return mean, scalar_std(host["fixed_std"][i], temperature, x)
        frac = (output[..., x.shape[-1] :] + 1.0) / 2.0
        log_var = frac * host["max_log"][i] + (1.0 - frac) * host["min_log"][i]
        return mean, torch.exp(0.5 * log_var) * temperature

    # ------------------------------------------------------------------ training-time forward process
    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t_train: torch.Tensor) -> torch.Tensor:
        """q(x_t | x0): sqrt(abar_t) x0 + sqrt(1 - abar_t) noise. t_train: integer training steps in
        [0, N) shaped like leading dims of x0 (trailing dims broadcast). Returns x0's dtype."""
        sqrt_abar, sqrt_one_minus = self._train_coefs(x0, noise, t_train)
        return (sqrt_abar * x0 + sqrt_one_minus * noise).to(x0.dtype)

    def training_target(self, x0: torch.Tensor, noise: torch.Tensor, t_train: torch.Tensor) -> torch.Tensor:
        """The regression target of the head's first C channels at t_train: noise (epsilon), x0
        (sample) or v = sqrt(abar) noise - sqrt(1 - abar) x0 (v_prediction)."""
        sqrt_abar, sqrt_one_minus = self._train_coefs(x0, noise, t_train)
        if self.prediction_type == "epsilon":
            return noise.clone()
        if self.prediction_type == "sample":
            return x0.clone()
        return (sqrt_abar * noise - sqrt_one_minus * x0).to(x0.dtype)

    def train_model_time(self, t_train: torch.Tensor) -> torch.Tensor:
        """The head's time input for training steps t_train (the step index itself, as float)."""
        return t_train.to(torch.float32)

    def _train_coefs(self, x0, noise, t_train):
        check_train_inputs(x0, noise, t_train, floating=False)
        if t_train.numel() and (int(t_train.min()) < 0 or int(t_train.max()) >= self.num_train_timesteps):
            raise ValueError(f"t_train: values must lie in [0, {self.num_train_timesteps}), got {int(t_train.min())}..{int(t_train.max())}")
        abar = per_token(torch.from_numpy(self._train_abar).to(x0.device)[t_train.long()], x0)
        return abar.sqrt(), (1.0 - abar).sqrt()

    def __repr__(self) -> str:
        return (
            f"DDPMSampler(num_steps={self.num_steps}, prediction_type={self.prediction_type!r}, "
            f"variance_type={self.variance_type!r}, timesteps={self.timesteps[0]}..{self.timesteps[-1]})"
        )


def _kept_timesteps(spacing, num_steps: int, num_train: int, steps_offset: int) -> list[int]:
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or not 1 <= num_steps <= num_train:
        raise ValueError(f"num_steps: got {num_steps!r}, expected an int in [1, {num_train}]")
    if isinstance(steps_offset, bool) or not isinstance(steps_offset, (int, np.integer)) or steps_offset < 0:
        raise ValueError(f"steps_offset: got {steps_offset!r}, expected an int >= 0")
    if isinstance(spacing, str):
        if spacing in schedules.DIFFUSERS_SPACINGS:
            return schedules.diffusers_timesteps(num_train, num_steps, spacing, steps_offset)
        if spacing in ("iddpm", "ddim"):
            counts = str(num_steps) if spacing == "iddpm" else f"ddim{num_steps}"
            return schedules.space_timesteps(num_train, counts)
        raise ValueError(f"spacing: got {spacing!r}, expected one of {', '.join(SPACINGS)} or a list of steps")
    kept = sorted((int(t) for t in spacing), reverse=True)
    if len(kept) != num_steps:
        raise ValueError(f"spacing: got {len(kept)} explicit timesteps, expected num_steps={num_steps}")
    schedules.check_timesteps(kept, num_train, "spacing")
    return kept
