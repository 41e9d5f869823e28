"""Fused multi-seed denoising: the main rollout chain and K extra seed chains of every token in one
batched pass, and the training-time recomputation of their recorded transition log-probabilities.

Per diffusion step the modulation (every block's shift/scale/gate) is computed once per (token, t)
from z and shared by all K + 1 trajectories and, with CFG, the two halves see one copy of x: the
head runs on x [K + 1, 1, N, C] against a modulation [2, N, W] (broadcast, never copied). The
step-independent part of the condition (the z projection) is computed once for all T steps.

Samplers follow docs/CONTRACTS.md (num_steps, model_time(i), out_channels(C), step(), logprob()).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from . import layers
from .cfg import Guidance
from .compiled import compiled_step_output
from .noise import resolve_noise


@dataclass
class MultiSeedSamples:
    """The result of multi_seed_denoise. Trajectory 0 is the main rollout chain, 1..K the seed chains.

    x0: [K+1, N, C] final clean tokens.
    steps: the recorded diffusion step indices (ascending), R of them.
    x_t, x_prev, mean, std: [K+1, R, N, C] (std expanded to full shape); logp: [K+1, R, N] (sum over
    channels; zeros on deterministic steps). When the call split its N tokens into `images` B images
    of P tokens (image-major), [K+1, B, R, P, C] and [K+1, B, R, P]: trajectory, image, diffusion
    step, token, the layout of a rollout's record (margrpo.rollout.record). fp32 (fp64 when z is fp64).
    """

    x0: torch.Tensor
    steps: tuple[int, ...]
    x_t: torch.Tensor
    x_prev: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    logp: torch.Tensor

    def to(self, *args, **kwargs) -> "MultiSeedSamples":
        """Every tensor moved/cast with Tensor.to(*args, **kwargs)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return MultiSeedSamples(**{k: v.to(*args, **kwargs) if isinstance(v, torch.Tensor) else v for k, v in values.items()})


_RECORDED = ("x_t", "x_prev", "mean", "std", "logp")


def _acc_dtype(z: torch.Tensor) -> torch.dtype:
    return torch.float64 if z.dtype == torch.float64 else torch.float32


def _condition_rows(head, z: torch.Tensor, cfg: Guidance | None) -> torch.Tensor:
    """z [rows, Dz] -> [N, Dz], or [2, N, Dz] (cond, uncond halves) with CFG."""
    if z.dim() != 2 or z.shape[1] != head.z_channels:
        raise ValueError(f"z: got shape {tuple(z.shape)}, expected [rows, {head.z_channels}]")
    if cfg is None:
        return z
    if not isinstance(cfg, Guidance):
        raise TypeError(f"cfg: got {type(cfg).__name__}, expected a margrpo.heads.Guidance or None")
    if z.shape[0] % 2:
        raise ValueError(f"z: got {z.shape[0]} rows with CFG, expected an even count [cond; uncond] = 2N")
    return z.reshape(2, z.shape[0] // 2, z.shape[1])


def _check_steps(record_steps, num_steps: int) -> tuple[int, ...]:
    steps = tuple(int(s) for s in record_steps)
    if len(set(steps)) != len(steps) or any(not 0 <= s < num_steps for s in steps):
        raise ValueError(f"record_steps: got {tuple(record_steps)}, expected distinct step indices in [0, {num_steps})")
    return tuple(sorted(steps))


def _check_channels(head, sampler) -> None:
    expected = sampler.out_channels(head.in_channels)
    if expected != head.out_channels:
        raise ValueError(
            f"sampler: needs {expected} head output channels for C={head.in_channels}, but the head outputs {head.out_channels}"
        )


def guided_output(
    head,
    modulation: layers.Modulation,
    x: torch.Tensor,
    cfg: Guidance | None,
    backend: str | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Head output for x [*L, N, C] under `modulation` ([N, W], or [..., 2, N, W] with CFG; both CFG
    halves read the same x), guided when cfg is given -> [*L, N, out]. scale: cfg's scale as a 0-d
    tensor (Guidance.combine)."""
    if cfg is None:
        return head.denoise(x, modulation, backend)
    out = head.denoise(x.unsqueeze(-3), modulation, backend)  # [*L, 2, N, out]
    return cfg.combine(out.select(-3, 0), out.select(-3, 1), head.in_channels, scale)


def step_output(
    head,
    cond: torch.Tensor,
    t: torch.Tensor,
    x: torch.Tensor,
    cfg: Guidance | None,
    backend: str | None = None,
    scale: torch.Tensor | None = None,
):
    """The head's (guided) output for x [K+1, N, C] at time t under the embedded condition `cond`
    (head.embed_condition of the rows): one diffusion step's network work."""
    return guided_output(head, head.modulation(cond, t), x, cfg, backend, scale)


def multi_seed_denoise(
    head,
    z: torch.Tensor,
    sampler,
    num_seeds: int,
    cfg: Guidance | None = None,
    generator: torch.Generator | None = None,
    record_steps=(),
    temperature: float = 1.0,
    noise=None,
    backend: str | None = None,
    cuda_graph: bool = False,
    images: int | None = None,
    compiled: bool = False,
) -> MultiSeedSamples:
    """Sample the main chain and `num_seeds` seed chains of N tokens in one batched pass (no grad).

    Args:
        head: SimpleMLPAdaLN or DiffusionMLP (frozen).
        z: [N, Dz], or [2N, Dz] = [cond; uncond] rows with CFG.
        sampler: a margrpo.diffusion sampler (T = sampler.num_steps).
        num_seeds: K >= 0 extra trajectories.
        cfg: Guidance with this call's scale, or None.
        generator: used for torch.randn noise when `noise` is None.
        record_steps: diffusion step indices whose transitions are kept.
        temperature: multiplies the sampler's std.
        noise: a [T+1, K+1, N, C] tensor (see margrpo.heads.noise), a CounterNoise, or None.
        backend: None (global margrpo.ops selection), "torch" or "triton" for the fused primitives.
        cuda_graph: replay the T-step loop from a captured CUDA graph when nothing is recorded
            (`rollout.cuda_graph`; margrpo.heads.cuda_graph.graphed_denoise): CUDA tensors only, an
            error naming that key otherwise; calls that record transitions run uncaptured.
        images: B, when the N tokens are B images' P = N / B tokens each (image-major): the recorded
            transitions come out [K+1, B, R, P, ...] (a rollout's layout) instead of [K+1, R, N, ...].
        compiled: run each step's head output (modulation, head, guidance) as a torch.compile graph
            (`rollout.compile_head`; margrpo.heads.compiled): compile fuses the head's elementwise
            work; the sampler step stays margrpo's fused op. One graph serves every step and token count.
    """
    if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 0:
        raise ValueError(f"num_seeds: got {num_seeds!r}, expected an int >= 0")
    if not temperature >= 0:
        raise ValueError(f"temperature: got {temperature!r}, expected a number >= 0")
    rows = _condition_rows(head, z, cfg)
    num_steps = sampler.num_steps
    steps = _check_steps(record_steps, num_steps)
    _check_channels(head, sampler)
    if images is not None and (isinstance(images, bool) or not isinstance(images, int) or images < 1 or rows.shape[-2] % images):
        raise ValueError(f"images: got {images!r}, expected None or an int >= 1 that divides the {rows.shape[-2]} tokens")
    if cuda_graph:
        from .cuda_graph import graphed_denoise

        graphed = graphed_denoise(head, z, sampler, num_seeds, cfg, steps, temperature, noise, generator, backend)
        if graphed is not None:  # its (empty) records in the layout `images` asks for
            return graphed if images is None else _split_images(graphed, images)
    tokens, channels = rows.shape[-2], head.in_channels
    eps = resolve_noise(noise, generator, (num_steps + 1, num_seeds + 1, tokens, channels), _acc_dtype(z), z.device)

    with torch.no_grad():
        return run_chains(head, rows, sampler, eps, steps, cfg, temperature, backend, images, compiled)


def _split_images(samples: MultiSeedSamples, images: int) -> MultiSeedSamples:
    """Records [K+1, R, N, ...] -> [K+1, B, R, P, ...] for N = images x P tokens."""
    split = {name: from_step_first(getattr(samples, name).movedim(1, 0), (images,)) for name in _RECORDED}
    return MultiSeedSamples(x0=samples.x0, steps=samples.steps, **split)


def step_times(sampler, steps, device: torch.device) -> torch.Tensor:
    """The head times of diffusion `steps` as a [len(steps)] tensor on `device`, gathered from the
    sampler's cached device table (no host-to-device copy)."""
    table = sampler.model_times_on(device)
    return torch.stack([table[i] for i in steps])


def run_chains(
    head,
    rows: torch.Tensor,
    sampler,
    eps: torch.Tensor,
    steps: tuple[int, ...],
    cfg: Guidance | None,
    temperature: float,
    backend: str | None,
    images: int | None = None,
    compiled: bool = False,
) -> MultiSeedSamples:
    """The batched T-step loop of multi_seed_denoise on validated inputs: rows = z as [N, Dz] or
    [2, N, Dz], eps [T+1, K+1, N, C] in the trajectory dtype, images B or None, compiled: the step's
    head output compiled. Nothing in the loop waits for the device: the head times are views of the
    sampler's device table."""
    acc = eps.dtype
    recorded: dict[str, list[torch.Tensor]] = {name: [] for name in _RECORDED}
    cond = head.embed_condition(rows)  # independent of the step: once for all T steps
    times = sampler.model_times_on(rows.device)
    if compiled:
        output = compiled_step_output(head, cond, cfg, backend)
    else:

        def output(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return step_output(head, cond, t, x, cfg, backend)

    x = eps[0]
    for i in range(sampler.num_steps):
        out = output(times[i], x).to(acc)
        step = sampler.step(out, x, i, eps[i + 1], temperature)
        if i in steps:
            std = torch.as_tensor(step.std, dtype=acc, device=x.device).expand_as(x)
            for name, value in zip(_RECORDED, (x, step.x_prev, step.mean, std, step.logp)):
                recorded[name].append(value)
        x = step.x_prev
    trajectories, N, C = eps.shape[1:]
    tokens = (trajectories, N) if images is None else (trajectories, images, N // images)
    stacked = {
        name: _stack(values, tokens if name == "logp" else (*tokens, C), len(tokens) - 1, acc, x.device)
        for name, values in recorded.items()
    }
    return MultiSeedSamples(x0=x, steps=steps, **stacked)


def _stack(values: list[torch.Tensor], shape: tuple[int, ...], axis: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The R per-step records [K+1, N(, C)], each viewed as `shape` = [K+1, *images, P(, C)] -> the
    step axis inserted at `axis`, right before the token axis: [K+1, *images, R, P(, C)]."""
    if values:
        return torch.stack([v.to(dtype).reshape(shape) for v in values], axis)
    return torch.empty((*shape[:axis], 0, *shape[axis:]), dtype=dtype, device=device)


def denoise_logprob(
    head,
    z: torch.Tensor,
    sampler,
    record: MultiSeedSamples,
    cfg: Guidance | None = None,
    temperature: float = 1.0,
    backend: str | None = None,
    return_mean: bool = False,
):
    """Log-probs [K+1, R, N] ([K+1, B, R, P]) of the recorded transitions of `record` (multi_seed_denoise's result)
    under a new z (training recomputation): transitions_logprob on its steps, x_t and x_prev."""
    return transitions_logprob(
        head,
        z,
        sampler,
        record.steps,
        record.x_t,
        record.x_prev,
        cfg=cfg,
        temperature=temperature,
        backend=backend,
        return_mean=return_mean,
    )


def transitions_logprob(
    head,
    z: torch.Tensor,
    sampler,
    steps,
    x_t: torch.Tensor,
    x_prev: torch.Tensor,
    cfg: Guidance | None = None,
    temperature: float = 1.0,
    backend: str | None = None,
    return_mean: bool = False,
):
    """Log-probs of the transitions x_t -> x_prev at diffusion `steps` (R ascending indices) under
    condition z [N, Dz] ([2N, Dz] = [cond; uncond] with guidance). x_t, x_prev: [K+1, R, N, C], or
    [K+1, B, R, P, C] for N = B * P tokens of B images (z's rows image-major; a rollout's layout,
    passed as a view; the head copies it step-first for its call) -> logp [K+1, R, N] or [K+1, B, R, P].

    Gradients flow to z through the head (whose parameters may be frozen: requires_grad False keeps
    the graph to z). All R steps go through the head in one batched call; x_t / x_prev are treated
    as data. With return_mean, also the sampler means, x_t's shape (e.g. for a Gaussian KL against
    a reference policy).
    """
    rows = _condition_rows(head, z, cfg)
    _check_channels(head, sampler)
    steps = _check_steps(steps, sampler.num_steps)
    acc = _acc_dtype(z)
    x_t, x_prev = x_t.detach().to(acc), x_prev.detach().to(acc)
    R, N = len(steps), rows.shape[-2]
    images = tuple(x_t.shape[1:-3])
    if x_t.dim() not in (4, 5) or x_t.shape[-3] != R or math.prod(images) * x_t.shape[-2] != N:
        raise ValueError(f"x_t: got shape {tuple(x_t.shape)}, expected [K+1, R={R}, N={N}, C] or [K+1, B, R={R}, P, C] with B * P = {N}")
    if x_prev.shape != x_t.shape:
        raise ValueError(f"x_prev: got shape {tuple(x_prev.shape)}, expected {tuple(x_t.shape)} like x_t")
    if not steps:
        empty = x_t.new_zeros(x_t.shape[:-1])
        return (empty, x_t.clone()) if return_mean else empty

    x_t, x_prev = step_first(x_t), step_first(x_prev)
    out = transition_outputs(head, rows, sampler, steps, x_t, cfg, backend)
    logp = torch.stack([sampler.logprob(x_prev[r], out[r], x_t[r], i, temperature) for r, i in enumerate(steps)])
    if not return_mean:
        return from_step_first(logp, images)
    means = torch.stack([sampler.mean_std(out[r], x_t[r], i, temperature)[0] for r, i in enumerate(steps)])
    return from_step_first(logp, images), from_step_first(means, images)


# The head evaluates recorded transitions step-first, [R, T, N, C] (N = images x P rows, image-major):
# the row order its GEMMs have always had. Any other order rounds differently in float32 (a GEMM's
# rows can round differently by where they fall in its blocking), and a training run then drifts
# from an earlier one after a few steps, so a record in another layout is copied into this order for
# the head's call and the result copied back.
def step_first(values: torch.Tensor) -> torch.Tensor:
    """A record [T, *images, R, P, C] -> [R, T, N, C], contiguous."""
    R, C = values.shape[-3], values.shape[-1]
    return values.movedim(-3, 0).reshape(R, values.shape[0], -1, C)


def from_step_first(values: torch.Tensor, images: tuple[int, ...]) -> torch.Tensor:
    """Per-transition values [R, T, N(, C)] -> the record layout [T, *images, R, P(, C)]."""
    R, T, N, tail = values.shape[0], values.shape[1], values.shape[2], values.shape[3:]
    per_image = N // math.prod(images) if images else N
    return values.reshape(R, T, *images, per_image, *tail).movedim(0, len(images) + 1)


def transition_outputs(
    head, rows: torch.Tensor, sampler, steps: tuple[int, ...], x_t: torch.Tensor, cfg: Guidance | None, backend: str | None = None
) -> torch.Tensor:
    """The head's (guided) outputs for recorded transitions x_t [R, T, N, C] (step-first) at
    diffusion `steps`, all R in one call, on validated inputs (rows: z as [N, Dz] or [2, N, Dz])
    -> [R, T, N, out] in x_t's dtype."""
    cond = head.embed_condition(rows)
    # [R] -> [R, 1, (1,) 1]: the step axis leads, then a singleton that broadcasts over trajectories
    times = step_times(sampler, steps, rows.device).reshape(len(steps), *([1] * cond.dim()))
    return guided_output(head, head.modulation(cond, times), x_t, cfg, backend).to(x_t.dtype)
