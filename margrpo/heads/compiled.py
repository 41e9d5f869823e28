"""The head's per-step output under torch.compile (`rollout.compile_head`).

One diffusion step's network work (the modulation at time t, the head's blocks, the CFG combine) is
compiled as one graph; the sampler step around it stays margrpo's fused op, so what compile adds is
the fusion of the head's elementwise work (LayerNorm, modulation, SiLU, residual gates) that eager
PyTorch runs as separate kernels. A step, not the whole T-step chain: the graph is T times smaller
to compile, and it does not change with the recorded steps, so recorded calls use it too.

Dynamo compiles one graph per head layout and guidance kind, with the trajectory and token counts
dynamic (marked before each call: a rollout's mask steps denoise different counts, with or without
seed chains) and the guidance scale a tensor input (a schedule changes it every mask step), and one
more for a lone main chain (a count of 1, which Dynamo always specialises). A single token runs
uncompiled: a graph of its own would cost a compile (seconds, inside whichever step first reveals
one token, e.g. the second of a 64-step NOVA schedule) for a step that takes microseconds.
If compiling fails, a warning names the key and the process goes on uncompiled: it is a speed
switch, and a training run should not die of it.
"""

from __future__ import annotations

import functools
import warnings

import torch

_FAILED: list[Exception] = []  # the compile error, once one happened in this process


@functools.cache
def _compiled():
    from .multi_seed import step_output

    return torch.compile(step_output, fullgraph=True)


def compiled_step_output(head, cond: torch.Tensor, cfg, backend: str | None = None):
    """For the T steps of one chain: a function of (t, x) giving margrpo.heads.multi_seed.step_output
    (head, cond, t, x, cfg, backend) from the compiled graph (uncompiled once compiling has failed).
    What is the same for every step (the condition's dynamic token axis, the scale tensor) is set up
    here, once per chain."""
    from .multi_seed import step_output

    def uncompiled(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return step_output(head, cond, t, x, cfg, backend)

    if _FAILED:
        return uncompiled
    torch._dynamo.maybe_mark_dynamic(cond, cond.dim() - 2)
    # the guidance scale as a graph input: a number would be a constant, and a schedule would recompile
    scale = None if cfg is None else torch.full((), cfg.scale, dtype=torch.float32, device=cond.device)

    def output(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if _FAILED or x.shape[-2] == 1:
            return uncompiled(t, x)
        x = x.contiguous()  # the first step's x is a view of the noise: strides are guarded
        # the trajectory and token counts vary between calls (seed chains or none; a mask step's tokens)
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(x, x.dim() - 2)
        try:
            return _compiled()(head, cond, t, x, cfg, backend, scale)
        except torch._dynamo.exc.TorchDynamoException as err:
            _FAILED.append(err)
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            warnings.warn(
                f"rollout.compile_head: torch.compile of the head's step failed ({reason}); this process runs "
                "it uncompiled from now on (set rollout.compile_head: false to skip the attempt)",
                stacklevel=2,
            )
            return uncompiled(t, x)

    return output
