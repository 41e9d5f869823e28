"""adapt(module): a diffusion head from another codebase as a margrpo DiffusionHead, without copying it.

    head = margrpo.heads.adapt(mar_model.diffloss.net)      # LTH14/mar or Harmon SimpleMLPAdaLN
    out = multi_seed_denoise(head, z, sampler, num_seeds=K)  # the fused K+1-chain path

Two routes, both holding the module itself as a submodule (no weight copies: its parameters are
the adapter's parameters, so an optimizer step or a load_state_dict on the module shows at once,
and gradients of denoise_logprob reach the module's parameters):
- a module with MAR's SimpleMLPAdaLN layout (time_embed.mlp, cond_embed, input_proj,
  res_blocks[i].{in_ln, mlp, adaLN_modulation}, final_layer.{norm_final, linear, adaLN_modulation})
  takes the shared-modulation path of margrpo's own SimpleMLPAdaLN: the modulation is computed once
  per (token, step) and broadcast over the seed chains and CFG halves;
- any other module with forward(x, t, c) (x [M, C], t [M], c [M, Dz] -> [M, out]) takes a generic
  path: all chains (and steps, and CFG halves) of a call flattened into ONE forward call; the
  module recomputes its own conditioning for every row, so it is slower but needs nothing else.
A margrpo head (one that already implements DiffusionHead) is returned unchanged.

Names alone do not prove that a module computes MAR's maths (a subclass may override forward, a
block may use another activation), so `path="auto"` (the default) takes the fast path only after a
probe: the module's own forward and the fast path, on a few random rows under random weights,
must agree. Otherwise it warns and takes the generic path, which calls the module's forward and is
therefore always right. `path="generic"` or `path="fast"` chooses without the probe.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from . import layers
from .layers import Modulation
from .mar_head import mar_denoise, mar_embed_condition, mar_modulation
from .protocol import DiffusionHead

MAR_LAYOUT = (
    "time_embed.mlp",
    "cond_embed",
    "input_proj",
    "res_blocks",
    "final_layer.norm_final",
    "final_layer.linear",
    "final_layer.adaLN_modulation",
)
BLOCK_LAYOUT = ("in_ln", "mlp", "adaLN_modulation")
PATHS = ("auto", "fast", "generic")
PROBE_TIMES = (0.0, 1.0, 250.0, 999.0)  # diffusion times of the probe's rows, as the samplers give them
PROBE_ROWS = len(PROBE_TIMES)
# agreement of the probe (relative to the output's scale): rounding of the module's dtype, far below
# what a changed activation, normalisation or extra term gives
PROBE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


def _has(module: nn.Module, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(module, part):
            return False
        module = getattr(module, part)
    return True


def has_mar_layout(module: nn.Module) -> bool:
    """True when `module` has SimpleMLPAdaLN's submodules (names as in LTH14/mar models/diffloss.py)."""
    if not all(_has(module, name) for name in MAR_LAYOUT):
        return False
    blocks = module.res_blocks
    return len(blocks) > 0 and all(_has(b, name) for b in blocks for name in BLOCK_LAYOUT)


class MARLayoutHead(nn.Module):
    """A module of SimpleMLPAdaLN's layout behind the DiffusionHead protocol (shared modulation)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        if not has_mar_layout(module):
            raise TypeError(
                f"module: {type(module).__name__} lacks SimpleMLPAdaLN's layout ({', '.join(MAR_LAYOUT)}, "
                f"res_blocks[i].{{{', '.join(BLOCK_LAYOUT)}}})"
            )
        self.module = module

    @property
    def in_channels(self) -> int:
        return self.module.input_proj.in_features

    @property
    def out_channels(self) -> int:
        return self.module.final_layer.linear.out_features

    @property
    def z_channels(self) -> int:
        return self.module.cond_embed.in_features

    def embed_condition(self, z: torch.Tensor) -> torch.Tensor:
        return mar_embed_condition(self.module, z)

    def modulation(self, cond: torch.Tensor, t) -> Modulation:
        return mar_modulation(self.module, cond, t)

    def denoise(self, x: torch.Tensor, modulation: Modulation, backend: str | None = None) -> torch.Tensor:
        return mar_denoise(self.module, x, modulation, backend)

    def forward(self, x: torch.Tensor, t, c: torch.Tensor) -> torch.Tensor:
        """The module's own forward."""
        return self.module(x, t, c)


@dataclass
class TimedCondition:
    """The generic path's "modulation": the conditions z [*B, N, Dz] and the diffusion time t
    (a tensor broadcastable against z's leading dims); the module computes the rest itself."""

    z: torch.Tensor
    t: torch.Tensor


class ForwardHead(nn.Module):
    """Any module with forward(x, t, c) behind the DiffusionHead protocol: one forward call per denoise."""

    def __init__(self, module: nn.Module, in_channels: int, out_channels: int, z_channels: int):
        super().__init__()
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels), ("z_channels", z_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: got {value!r}, expected a positive int")
        self.module = module
        self.in_channels, self.out_channels, self.z_channels = in_channels, out_channels, z_channels

    def _dtype(self, like: torch.Tensor) -> torch.dtype:
        for p in self.module.parameters():
            return p.dtype if p.is_floating_point() else like.dtype
        return like.dtype

    def embed_condition(self, z: torch.Tensor) -> torch.Tensor:
        if z.shape[-1] != self.z_channels:
            raise ValueError(f"z: got shape {tuple(z.shape)}, expected [..., N, {self.z_channels}]")
        return z

    def modulation(self, cond: torch.Tensor, t) -> TimedCondition:
        return TimedCondition(cond, layers.as_time_tensor(t, cond.device))

    def denoise(self, x: torch.Tensor, modulation: TimedCondition, backend: str | None = None) -> torch.Tensor:
        """Broadcast x, z and t to one shape [*lead, N], flatten it into rows, one module call."""
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"x: got shape {tuple(x.shape)}, expected [..., N, {self.in_channels}]")
        z, t = modulation.z, modulation.t
        lead = torch.broadcast_shapes(x.shape[:-1], z.shape[:-1], t.shape)
        dtype = self._dtype(x)
        rows_x = x.to(dtype).expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1])
        rows_z = z.to(dtype).expand(*lead, z.shape[-1]).reshape(-1, z.shape[-1])
        out = self.module(rows_x, t.expand(lead).reshape(-1), rows_z)
        if out.shape != (rows_x.shape[0], self.out_channels):
            raise ValueError(
                f"module output: got shape {tuple(out.shape)}, expected [{rows_x.shape[0]}, {self.out_channels}] (out_channels)"
            )
        return out.reshape(*lead, self.out_channels)

    def forward(self, x: torch.Tensor, t, c: torch.Tensor) -> torch.Tensor:
        """The module's own forward."""
        return self.module(x, t, c)


class _Probe(nn.Module):
    """Both paths of one SimpleMLPAdaLN-layout module on the same rows, for torch.func.functional_call."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor):
        own = self.module(x, t, c)
        try:
            fast = mar_denoise(self.module, x, mar_modulation(self.module, mar_embed_condition(self.module, c), t))
        except Exception as err:  # a layout the fast path cannot read (e.g. no Linear at adaLN_modulation[-1])
            return own, err
        return own, fast


def fast_path_mismatch(module: nn.Module) -> str | None:
    """None when margrpo's fast path computes what `module`'s own forward(x, t, c) does, else why not.

    Checked on PROBE_ROWS random rows with random weights put in place of the module's (through
    torch.func.functional_call, the module is not changed): a fresh head's adaLN-Zero init outputs
    zeros whatever its forward does, so its own weights could not tell the two apart. The probe runs
    in float32 (float64 for a float64 module), whatever the module's dtype: it checks the maths, not
    half-precision rounding. Costs one temporary float32 copy of the parameters."""
    params = list(module.named_parameters())
    if not params:
        return "it has no parameters"
    dtype, device = params[0][1].dtype, params[0][1].device
    if device.type == "meta" or not dtype.is_floating_point:
        return f"its parameters are on {device.type} in {dtype}, where the check cannot run"
    dtype = torch.float64 if dtype == torch.float64 else torch.float32
    g = torch.Generator().manual_seed(0)

    def random_like(p: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
        value = noise / p.shape[-1] ** 0.5 if p.dim() > 1 else p.detach().cpu().double() + 0.1 * noise
        return value.to(device, dtype)

    weights = {f"module.{name}": random_like(p) for name, p in params}
    x = torch.randn(PROBE_ROWS, module.input_proj.in_features, generator=g, dtype=torch.float64).to(device, dtype)
    c = torch.randn(PROBE_ROWS, module.cond_embed.in_features, generator=g, dtype=torch.float64).to(device, dtype)
    t = torch.tensor(PROBE_TIMES, device=device)
    try:
        with torch.no_grad():
            own, fast = torch.func.functional_call(_Probe(module), weights, (x, t, c), strict=False)
    except Exception as err:
        raise TypeError(
            f"adapt: {type(module).__name__}.forward(x [{PROBE_ROWS}, C], t [{PROBE_ROWS}], "
            f"c [{PROBE_ROWS}, Dz]) failed in the check of the fast path ({type(err).__name__}: {err}); "
            "pass path='fast' to skip the check or path='generic'"
        ) from err
    if isinstance(fast, Exception):
        return f"the fast path cannot read its layers ({type(fast).__name__}: {fast})"
    if not isinstance(own, torch.Tensor) or own.shape != fast.shape:
        got = tuple(own.shape) if isinstance(own, torch.Tensor) else type(own).__name__
        return f"its forward(x, t, c) gives {got}, the fast path {tuple(fast.shape)}"
    scale = float(own.double().abs().max()) + 1e-12
    error = float((own.double() - fast.double()).abs().max()) / scale
    if error > PROBE_TOLERANCE[dtype]:
        return (
            f"its forward(x, t, c) differs from SimpleMLPAdaLN's maths (relative error {error:.1e} on random "
            "weights: an overridden forward or another layer in the blocks)"
        )
    return None


def adapt(
    module: nn.Module, *, path: str = "auto", in_channels: int | None = None, out_channels: int | None = None, z_channels: int | None = None
) -> DiffusionHead:
    """`module` as a DiffusionHead for multi_seed_denoise / denoise_logprob / the rollout.

    A margrpo head comes back unchanged. path:
      "auto" (default): a SimpleMLPAdaLN-layout module whose forward the fast path reproduces
        (fast_path_mismatch) gets the shared-modulation path; any other module the generic path
        (with a warning saying why when it has the layout's names);
      "fast": the shared-modulation path without the check (the module must compute MAR's
        SimpleMLPAdaLN; an error when it lacks the layout);
      "generic": one forward(x, t, c) call per denoise, for any module.
    The generic path's sizes come from the keyword arguments, else the module's layers (the
    SimpleMLPAdaLN layout) or its own in_channels / out_channels / z_channels attributes
    (out_channels defaults to in_channels)."""
    if path not in PATHS:
        raise ValueError(f"path: got {path!r}, expected one of {', '.join(PATHS)}")
    if isinstance(module, DiffusionHead):
        return module
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: got {type(module).__name__}, expected a torch.nn.Module")
    layout = has_mar_layout(module)
    if path == "fast":
        return MARLayoutHead(module)  # raises, naming the layout, when the module lacks it
    if path == "auto" and layout:
        why = fast_path_mismatch(module)
        if why is None:
            return MARLayoutHead(module)
        warnings.warn(
            f"adapt: {type(module).__name__} has SimpleMLPAdaLN's layer names but {why}; taking the "
            "generic forward(x, t, c) path (pass path='generic' to choose it without this check, or "
            "path='fast' to force the shared-modulation path)",
            stacklevel=2,
        )
    if layout:  # sizes from the layers, unless given
        in_channels = in_channels if in_channels is not None else module.input_proj.in_features
        out_channels = out_channels if out_channels is not None else module.final_layer.linear.out_features
        z_channels = z_channels if z_channels is not None else module.cond_embed.in_features
    in_channels = in_channels if in_channels is not None else getattr(module, "in_channels", None)
    out_channels = out_channels if out_channels is not None else getattr(module, "out_channels", in_channels)
    z_channels = z_channels if z_channels is not None else getattr(module, "z_channels", None)
    missing = [n for n, v in (("in_channels", in_channels), ("z_channels", z_channels)) if v is None]
    if missing:
        raise ValueError(
            f"adapt: {type(module).__name__} has no SimpleMLPAdaLN layout, so the generic "
            f"forward(x, t, c) path needs {' and '.join(missing)}: pass adapt(module, " + ", ".join(f"{n}=..." for n in missing) + ")"
        )
    return ForwardHead(module, in_channels, out_channels, z_channels)
