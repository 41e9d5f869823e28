"""Triton kernels of the fused ops, installed as the subpackage ``margrpo.kernels``.

One module per op (gaussian_logprob, trajectory_std, topk, consistency, grpo_surrogate); each exposes
launch helpers with exactly the signatures of ``margrpo.ops.reference`` (see docs/CONTRACTS.md).
No autograd here: margrpo.ops wraps these. Modules import triton, so they are loaded on demand.
"""
__all__ = ["consistency", "gaussian_logprob", "grpo_surrogate", "topk", "trajectory_std"]
