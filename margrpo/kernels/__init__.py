"""Triton kernels of the fused ops: ``margrpo.kernels``.

One module per op (gaussian_logprob, trajectory_std, topk, consistency, grpo_surrogate) and the heads'
adaln; each exposes launch helpers with exactly the signatures of ``margrpo.ops.oracle`` (see
docs/CONTRACTS.md). No autograd here: margrpo.ops wraps these. Modules import triton, so they are
loaded on demand.

Their sources are in the checkout's top-level ``kernels/`` folder, which has no ``__init__.py``: from
the checkout root it would otherwise import as ``kernels`` and shadow the PyPI package of that name
that transformers and peft import. A wheel (setup.py) copies them here; in the checkout (editable
install) this package's path reaches into that folder instead.
"""

import os

_here = os.path.dirname(os.path.abspath(__file__))
_checkout_kernels = os.path.join(os.path.dirname(os.path.dirname(_here)), "kernels")
if not os.path.isfile(os.path.join(_here, "topk.py")) and os.path.isfile(os.path.join(_checkout_kernels, "topk.py")):
    __path__.append(_checkout_kernels)

__all__ = ["adaln", "consistency", "gaussian_logprob", "grpo_surrogate", "topk", "trajectory_std"]
