"""CUDA's autocast rules on the CPU, for tests of code that runs under bf16 autocast on a GPU.

CPU autocast casts fewer ops than CUDA autocast: on CUDA, layer_norm, group_norm, softmax, exp, log,
pow, sum, ... run in float32 (their bf16 inputs are upcast, so their outputs are float32); on CPU
they keep bf16. Code can therefore mix dtypes only on a GPU (a bf16 block output next to a float32
norm output: scatter / index_put refuse the pair), and a CPU test under torch.autocast("cpu") would
not see it. `cuda_autocast_rules()` registers AutocastCPU kernels that apply CUDA's policy to those
ops (float32 for the fp32 lists, the autocast dtype for the few matmul-like ops CPU leaves alone, the
widest dtype for CUDA's promote list) for the duration of the context.
Op lists: aten/src/ATen/autocast_mode.cpp (CUDA), torch 2.x.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch.utils._pytree import tree_map

# CUDA CastPolicy::fp32 and fp32_set_opt_dtype (an unset dtype means float32) ops
FP32 = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "prod",
    "prod.dim_int",
    "softmax.int",
    "log_softmax.int",
    "cumprod",
    "cumsum",
    "linalg_vector_norm",
    "sum",
    "sum.dim_IntList",
)
LOWER = ("einsum", "mv", "addmv", "addr", "chain_matmul", "linalg_multi_dot")  # lower precision on CUDA, not on CPU
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "index_put", "scatter_add", "tensordot")
_HALF = (torch.float16, torch.bfloat16)


def _op(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _kernel(op, cast):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
            args, kwargs = cast((args, kwargs))
            return op(*args, **kwargs)

    return kernel


def _to(dtype):
    def convert(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
            return value.to(dtype)
        return value

    return lambda tree: tree_map(convert, tree)


def _upcast_half(tree):
    return tree_map(lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF else v, tree)


def _promote(tree):
    tensors = [v for v in torch.utils._pytree.tree_leaves(tree) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not tensors:
        return tree
    widest = tensors[0].dtype
    for t in tensors[1:]:
        widest = torch.promote_types(widest, t.dtype)
    return _to(widest)(tree)


@contextlib.contextmanager
def cuda_autocast_rules():
    """Inside: torch.autocast("cpu", dtype=torch.bfloat16) casts as CUDA autocast does."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel" (CPU's own policy)
            for name in FP32:
                lib.impl(name, _kernel(_op(name), _upcast_half), "AutocastCPU")
            for name in LOWER:
                lib.impl(name, _kernel(_op(name), lambda tree: _to(torch.get_autocast_dtype("cpu"))(tree)), "AutocastCPU")
            for name in PROMOTE:
                lib.impl(name, _kernel(_op(name), _promote), "AutocastCPU")
        yield
    finally:
        lib._destroy()
