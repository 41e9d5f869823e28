"""Building samplers from presets and configs: make_sampler, from_diffusers_config, mar_sampler."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Mapping

from . import schedules
from .ddpm import DDPMSampler
from .flow import FlowSDESampler
from .sampler import Sampler

DIFFUSERS_CONFIG_NAME = "scheduler_config.json"

# diffusers DDPMScheduler keys -> their defaults (a key missing from a config takes this value)
_DDPM_DEFAULTS: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "trained_betas": None,
    "variance_type": "fixed_small",
    "clip_sample": True,
    "clip_sample_range": 1.0,
    "prediction_type": "epsilon",
    "thresholding": False,
    "dynamic_thresholding_ratio": 0.995,
    "sample_max_value": 1.0,
    "timestep_spacing": "leading",
    "steps_offset": 0,
    "rescale_betas_zero_snr": False,
}
# diffusers variance names -> ours ("_log" variants are the same distribution, returned as a log/std)
_DDPM_VARIANCE = {
    "fixed_small": "fixed_small",
    "fixed_small_log": "fixed_small",
    "fixed_large": "fixed_large",
    "fixed_large_log": "fixed_large",
    "learned_range": "learned_range",
}
# diffusers/NOVA FlowMatchEulerDiscreteScheduler keys: the ones read, the features that must stay off
# (key -> its "off" value), and the ones that only tune a feature that is off
_FLOW_USED = ("num_train_timesteps", "shift")
_FLOW_OFF: dict[str, Any] = {
    "use_dynamic_shifting": False,
    "invert_sigmas": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "stochastic_sampling": False,
}
_FLOW_IGNORED = ("base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type")


def mar_sampler(num_steps: int | str, noise_schedule: str = "cosine", learn_sigma: bool = True) -> DDPMSampler:
    """The MAR / Harmon diffusion-loss sampler (LTH14/mar create_diffusion with respacing).

    num_steps: T, or an IDDPM section string ("100", "ddim25", "10,15,20"). noise_schedule:
    "cosine" or "linear" (IDDPM's 1000-step linear). learn_sigma: learned-range variance (head
    outputs 2C channels); otherwise fixed-large, as create_diffusion does with sigma_small=False.
    eps-prediction, no x0 clipping (MAR samples with clip_denoised=False).
    """
    if noise_schedule not in ("cosine", "linear"):
        raise ValueError(f"noise_schedule: got {noise_schedule!r}, expected 'cosine' or 'linear'")
    if not isinstance(learn_sigma, bool):
        raise ValueError(f"learn_sigma: got {learn_sigma!r}, expected a bool")
    num_train = 1000
    if isinstance(num_steps, str):
        kept = schedules.space_timesteps(num_train, num_steps)
    elif isinstance(num_steps, int) and not isinstance(num_steps, bool) and 1 <= num_steps <= num_train:
        kept = schedules.space_timesteps(num_train, str(num_steps))
    else:
        raise ValueError(f"num_steps: got {num_steps!r}, expected an int in [1, {num_train}] or an IDDPM section string")
    return DDPMSampler(
        len(kept),
        num_train_timesteps=num_train,
        beta_schedule=noise_schedule,
        spacing=kept,
        prediction_type="epsilon",
        variance_type="learned_range" if learn_sigma else "fixed_large",
        clip_sample=None,
    )


def from_diffusers_config(config: Mapping[str, Any] | str | os.PathLike, num_steps: int, **options) -> Sampler:
    """A sampler with the semantics of a diffusers scheduler_config.json (NOVA checkpoints).

    config: the parsed dict, a scheduler_config.json path, or a directory holding it (directly or
    in scheduler/). The class comes from "_sample_class_name" (NOVA's sampling scheduler), else
    "_class_name" (default DDPMScheduler). DDPMScheduler -> DDPMSampler; FlowMatchEulerDiscrete-
    Scheduler -> FlowSDESampler. options go to the sampler's constructor and win over the config
    (e.g. noise_level=0.7 or mode="ode" for flow, NOVA's pipeline flow_shift as flow_shift=...).
    Unknown keys and enabled features this library does not implement raise ValueError.

    NOVA's own schedulers define the semantics, where they differ from diffusers': DDPM never clips
    the predicted x0 (the config's clip_sample / clip_sample_range are read and ignored; pass
    clip_sample=r to clip), and flow_shift keeps the sigma range of the config's shift.
    """
    data = _load_config(config)
    class_name = data.get("_sample_class_name") or data.get("_class_name") or "DDPMScheduler"
    keys = {k: v for k, v in data.items() if not k.startswith("_")}
    if class_name == "DDPMScheduler":
        kwargs = _ddpm_kwargs(keys)
        kwargs.update(options)
        return _construct(DDPMSampler, "from_diffusers_config", num_steps=num_steps, **kwargs)
    if class_name == "FlowMatchEulerDiscreteScheduler":
        kwargs = _flow_kwargs(keys)
        kwargs.update(options)
        return _construct(FlowSDESampler, "from_diffusers_config", num_steps=num_steps, **kwargs)
    raise ValueError(f"config: scheduler class {class_name!r} is not supported, expected DDPMScheduler or FlowMatchEulerDiscreteScheduler")


_KINDS = {"ddpm": DDPMSampler, "flow": FlowSDESampler, "mar": mar_sampler, "diffusers": from_diffusers_config}


def make_sampler(kind: str, **cfg) -> Sampler:
    """A sampler by kind: "ddpm" (DDPMSampler), "flow" (FlowSDESampler), "mar" (mar_sampler) or
    "diffusers" (from_diffusers_config(config=..., num_steps=..., ...)). cfg are that builder's
    keyword arguments; an unknown one raises ValueError naming it."""
    if kind not in _KINDS:
        raise ValueError(f"kind: got {kind!r}, expected one of {', '.join(_KINDS)}")
    return _construct(_KINDS[kind], f"make_sampler(kind={kind!r})", **cfg)


def _construct(builder, caller: str, **kwargs):
    """Call builder(**kwargs), first naming any keyword it does not accept."""
    params = inspect.signature(builder).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            accepted = sorted(name for name in params if name != "self")
            raise ValueError(f"{caller}: unknown option(s) {unknown}; expected some of {accepted}")
    return builder(**kwargs)


def _load_config(config) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise ValueError(f"config: got {type(config).__name__}, expected a dict or a path to {DIFFUSERS_CONFIG_NAME}")
    path = Path(config)
    if path.is_dir():
        candidates = [path / DIFFUSERS_CONFIG_NAME, path / "scheduler" / DIFFUSERS_CONFIG_NAME]
        path = next((c for c in candidates if c.is_file()), candidates[0])
    if not path.is_file():
        raise FileNotFoundError(f"config: {path} does not exist (expected a diffusers {DIFFUSERS_CONFIG_NAME})")
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"config: {path} holds a {type(data).__name__}, expected a JSON object")
    return data


def _ddpm_kwargs(keys: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(keys) - set(_DDPM_DEFAULTS))
    if unknown:
        raise ValueError(f"config: unknown DDPMScheduler key(s) {unknown}; expected some of {sorted(_DDPM_DEFAULTS)}")
    cfg = {**_DDPM_DEFAULTS, **keys}
    for feature in ("thresholding", "rescale_betas_zero_snr"):
        if cfg[feature]:
            raise ValueError(f"config: {feature}={cfg[feature]!r} is not supported, expected false")
    if cfg["variance_type"] not in _DDPM_VARIANCE:
        raise ValueError(f"config: variance_type={cfg['variance_type']!r} is not supported, expected one of {', '.join(_DDPM_VARIANCE)}")
    return {
        "num_train_timesteps": cfg["num_train_timesteps"],
        "beta_schedule": cfg["beta_schedule"],
        "beta_start": cfg["beta_start"],
        "beta_end": cfg["beta_end"],
        "trained_betas": cfg["trained_betas"],
        "spacing": cfg["timestep_spacing"],
        "steps_offset": cfg["steps_offset"],
        "prediction_type": cfg["prediction_type"],
        "variance_type": _DDPM_VARIANCE[cfg["variance_type"]],
        "clip_sample": None,  # NOVA's DDPMScheduler.step never clips, whatever the config says
    }


def _flow_kwargs(keys: dict[str, Any]) -> dict[str, Any]:
    known = set(_FLOW_USED) | set(_FLOW_OFF) | set(_FLOW_IGNORED)
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ValueError(f"config: unknown FlowMatchEulerDiscreteScheduler key(s) {unknown}; expected some of {sorted(known)}")
    for key, off in _FLOW_OFF.items():
        if keys.get(key, off) != off:
            raise ValueError(f"config: {key}={keys[key]!r} is not supported by FlowSDESampler, expected {off!r}")
    return {key: keys[key] for key in _FLOW_USED if key in keys}
