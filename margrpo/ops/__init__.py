"""The public fused ops of margrpo (see docs/CONTRACTS.md for the kernel layer beneath them).

Each op validates and normalises its input, picks a backend (torch | triton | cuda | cpp; `auto`
by default or env MARGRPO_BACKEND) and has a torch.library custom op in namespace `margrpo`, so it
works under torch.compile(fullgraph=True), fake tensors, opcheck and autograd. In plain eager mode
the op calls the backend's kernels directly, skipping the custom op's dispatch (see _kernels.py).

Where each op's pieces are: its public function and `FusedOp` in margrpo/ops/<module>.py, its eager
oracle (the torch backend) in oracle.py, its Triton kernels in the checkout's kernels/<module>.py
(margrpo.kernels.<module>), its C++/CUDA kernels in csrc/<module>.{h,cpp} and csrc/<module>_cuda.cu,
its tests in tests/test_ops_<module>.py; the per-op table is in CONTRIBUTING.md ("A new fused op").
Modules: gaussian_logprob, trajectory_std, topk (topk_mask, topk_indices), consistency
(consistency_mask), grpo_surrogate, adaln (ln_modulate, gate_residual: the diffusion heads' adaLN
steps; torch and triton only, forward-only kernels).
"""

from . import _backend

# load margrpo._C first: its TORCH_LIBRARY registrations back the cpp/cuda backends (None if not built)
_backend.extension()

from ._backend import available_backends, get_backend, set_backend, use_backend  # noqa: E402
from .adaln import gate_residual, ln_modulate  # noqa: E402
from .consistency import consistency_mask  # noqa: E402
from .gaussian_logprob import gaussian_logprob  # noqa: E402
from .grpo_surrogate import STATISTICS, GRPOLoss, grpo_surrogate, token_weights  # noqa: E402
from .topk import topk_indices, topk_mask  # noqa: E402
from .trajectory_std import trajectory_std  # noqa: E402

__all__ = [
    "STATISTICS",
    "GRPOLoss",
    "available_backends",
    "consistency_mask",
    "gate_residual",
    "gaussian_logprob",
    "get_backend",
    "grpo_surrogate",
    "ln_modulate",
    "set_backend",
    "token_weights",
    "topk_indices",
    "topk_mask",
    "trajectory_std",
    "use_backend",
]
