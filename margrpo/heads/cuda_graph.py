"""Optional CUDA-graph capture of the whole T-step multi-seed chain (CUDA only, opt-in).

At rollout sizes each diffusion step launches a few dozen small kernels; replaying the captured
T-step loop removes the per-launch CPU cost. A graph bakes in every shape and setting, so a
`GraphedMultiSeed` is built for one (head, sampler, K, cfg scale, recorded steps, temperature)
and captures one graph per (token count, dtype) on first use; later calls copy z and the noise into
the captured input buffers, replay and return copies of the outputs. The head's parameters are read
at replay, so in-place weight updates are seen; replacing a parameter tensor is not.

The rollout uses it under `rollout.cuda_graph: true` (multi_seed_denoise(..., cuda_graph=True) ->
`graphed_denoise`): one GraphedMultiSeed per (head, sampler, K, guidance, temperature, backend), every
graph of a head in one shared memory pool (a replay's outputs are copied out before anything else
replays, so graphs may share it in any order), and only the mask steps that record no transition
are captured: a recorded step's diffusion steps are drawn per rollout, and a graph per draw would be
captured once and never replayed, so those steps run uncaptured.
"""

from __future__ import annotations

import weakref
from dataclasses import fields

import torch

from .cfg import Guidance
from .multi_seed import (
    MultiSeedSamples,
    _acc_dtype,
    _check_channels,
    _check_steps,
    _condition_rows,
    run_chains,
)
from .noise import resolve_noise


class _Captured:
    """One captured chain: static inputs, the graph, and its static outputs."""

    def __init__(self, run, rows: torch.Tensor, eps: torch.Tensor, pool=None):
        self.rows, self.eps = rows.clone(), eps.clone()
        side = torch.cuda.Stream(device=rows.device)
        side.wait_stream(torch.cuda.current_stream(rows.device))
        with torch.cuda.stream(side):  # warm-up outside the capture (allocator, Triton compilation)
            run(self.rows, self.eps)
        torch.cuda.current_stream(rows.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = run(self.rows, self.eps)

    def __call__(self, rows: torch.Tensor, eps: torch.Tensor) -> MultiSeedSamples:
        self.rows.copy_(rows)
        self.eps.copy_(eps)
        self.graph.replay()
        values = {f.name: getattr(self.out, f.name) for f in fields(self.out)}
        return MultiSeedSamples(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in values.items()})


class GraphedMultiSeed:
    """multi_seed_denoise with the T-step loop captured in a CUDA graph.

    Same arguments and result as margrpo.heads.multi_seed_denoise, split into the fixed part (here)
    and the per-call part (`__call__(z, noise=None, generator=None)`).
    """

    def __init__(
        self,
        head,
        sampler,
        num_seeds: int,
        cfg: Guidance | None = None,
        record_steps=(),
        temperature: float = 1.0,
        backend: str | None = None,
        pool=None,
    ):
        if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 0:
            raise ValueError(f"num_seeds: got {num_seeds!r}, expected an int >= 0")
        _check_channels(head, sampler)
        self.head, self.sampler, self.num_seeds, self.cfg = head, sampler, num_seeds, cfg
        self.steps = _check_steps(record_steps, sampler.num_steps)
        self.temperature, self.backend, self.pool = temperature, backend, pool
        self._graphs: dict[tuple, _Captured] = {}

    def __call__(self, z: torch.Tensor, noise=None, generator: torch.Generator | None = None) -> MultiSeedSamples:
        if z.device.type != "cuda":
            raise ValueError(f"z: got a tensor on {z.device}, expected a CUDA tensor (CUDA graphs)")
        rows = _condition_rows(self.head, z, self.cfg)
        shape = (self.sampler.num_steps + 1, self.num_seeds + 1, rows.shape[-2], self.head.in_channels)
        eps = resolve_noise(noise, generator, shape, _acc_dtype(z), z.device)
        key = (tuple(rows.shape), rows.dtype, rows.device)
        if key not in self._graphs:

            def run(static_rows, static_eps):
                return run_chains(self.head, static_rows, self.sampler, static_eps, self.steps, self.cfg, self.temperature, self.backend)

            with torch.no_grad():
                self._graphs[key] = _Captured(run, rows, eps, self.pool)
        with torch.no_grad():
            return self._graphs[key](rows, eps)


CUDA_GRAPH_KEY = "rollout.cuda_graph"

# head -> (shared graph memory pool, {(sampler id, K, guidance, temperature, backend): GraphedMultiSeed})
_ROLLOUT_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_cuda_graph_device(z: torch.Tensor) -> None:
    """The error of `rollout.cuda_graph: true` off CUDA, naming the key."""
    if z.device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"{CUDA_GRAPH_KEY}: got true with the rollout on {z.device}, expected a CUDA device "
            f"(CUDA graphs capture CUDA kernels; set {CUDA_GRAPH_KEY}: false, or run.device: cuda)"
        )


def graphed_denoise(head, z, sampler, num_seeds: int, cfg, steps: tuple[int, ...], temperature: float, noise, generator, backend):
    """multi_seed_denoise(..., cuda_graph=True) on validated arguments: a captured chain when nothing
    is recorded (`steps` empty), else None (the caller runs the uncaptured loop)."""
    check_cuda_graph_device(z)
    if steps:
        return None
    pool, graphs = _ROLLOUT_GRAPHS.setdefault(head, (torch.cuda.graph_pool_handle(), {}))
    key = (id(sampler), num_seeds, cfg, float(temperature), backend)
    graphed = graphs.get(key)
    if graphed is None or graphed.sampler is not sampler:  # an id reused by a new sampler: capture again
        graphed = graphs[key] = GraphedMultiSeed(head, sampler, num_seeds, cfg, (), temperature, backend, pool=pool)
    return graphed(z, noise=noise, generator=generator)
