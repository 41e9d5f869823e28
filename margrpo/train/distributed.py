"""torch.distributed plumbing for torchrun: init from the environment, the two data-parallel modes,
and metric/reward gathering. Every function is a no-op in a single process.

- ddp: weights replicated on every rank; average_gradients() all-reduces the gradients after backward
  (DDP semantics without the DDP wrapper: a backbone's forward is not one nn.Module call).
- fsdp2: shard_fsdp2() applies torch.distributed.fsdp.fully_shard to the trainable modules (each
  transformer block, a trainable diffusion head, then the backbone root); FSDP2 all-gathers a
  module's parameters around its calls and reduce-scatters (averages) the gradients in backward.
  Checkpoints gather full tensors (full_state_dict / full_optimizer_state), keyed by parameter name,
  so a checkpoint written under FSDP2 loads in one process and the other way round.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

# MARBackbone methods that read the backbone's own parameters outside nn.Module.__call__
BACKBONE_METHODS = ("encode_prompts", "forward_z", "decode")
# diffusion-head methods that read the head's parameters (margrpo.heads: the split path and forward)
HEAD_METHODS = ("embed_condition", "modulation", "condition", "denoise", "forward")


def init() -> tuple[int, int]:
    """(rank, world size); initialises the default group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def device_for_rank(device: torch.device, rank: int) -> torch.device:
    if device.type == "cuda" and active():
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return device


def average_gradients(module: torch.nn.Module) -> None:
    """All-reduce and average every parameter gradient (what DDP does after backward)."""
    if not active():
        return
    world = dist.get_world_size()
    for param in module.parameters():
        if param.requires_grad:
            if param.grad is None:  # keep the collective aligned across ranks
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad.div_(world)


def all_gather_cat(values: torch.Tensor) -> torch.Tensor:
    """Concatenate a same-shaped tensor from every rank, in rank order."""
    if not active():
        return values
    parts = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, values.contiguous())
    return torch.cat(parts)


def all_gather_objects(items: list) -> list:
    if not active():
        return list(items)
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def mean(value) -> float:
    """The mean of a scalar over ranks."""
    tensor = torch.as_tensor(float(value), dtype=torch.float64)
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= dist.get_world_size()
    return tensor.item()


def all_ranks(flag: bool) -> bool:
    """True when `flag` holds on every rank (a skip decision every rank must take together, or the
    ranks that go on wait forever in the next collective)."""
    tensor = torch.tensor(int(bool(flag)), dtype=torch.int32)
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


# ---------------------------------------------------------------------- FSDP2
def is_sharded(model: nn.Module) -> bool:
    """Whether shard_fsdp2() sharded `model`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _has_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def transformer_blocks(model: nn.Module, exclude: Iterable[nn.Module] = ()) -> list[nn.Module]:
    """The FSDP units below the root: every element of an nn.ModuleList that holds a trainable
    parameter (outermost lists first; nothing under an excluded module or an already chosen block).

    Layers of a Hugging Face transformers model are never units: their keys and values leave through
    a Cache object (Harmon's prompt KV), a path FSDP's backward hooks do not see, so a resharded layer
    would be needed after its parameters were freed. Their trainable parameters join the root unit,
    which stays gathered from the first forward call of a step until its backward is done."""
    skip = {id(m) for m in exclude}
    transformers = sys.modules.get("transformers")  # not imported: the model holds none of its modules
    hf_model = (transformers.PreTrainedModel,) if transformers is not None else ()
    blocks: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in skip or isinstance(child, hf_model):
                continue
            if isinstance(module, nn.ModuleList) and _has_trainable(child):
                blocks.append(child)
            else:
                visit(child)

    visit(model)
    return blocks


def shard_fsdp2(model: nn.Module, device: torch.device) -> list[nn.Module]:
    """Shard a MAR backbone's trainable part over all ranks with FSDP2 (in place); returns the FSDP
    units, root last. Call it after requires_grad is set and before the optimizer is built.

    Units: each transformer block (transformer_blocks), the diffusion head when it is trainable,
    then the root, which takes the remaining trainable parameters. Frozen parameters outside the
    blocks (a frozen head, a VAE, a frozen text encoder) stay ordinary replicated tensors
    (ignored_params): they need no gradient and no sharding bookkeeping. The backbone's and head's
    non-forward entry points are registered with register_fsdp_forward_method, so their parameters
    are all-gathered whenever the rollout or the likelihood calls them.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    if not active():
        raise RuntimeError("run.parallel: fsdp2 needs torch.distributed with more than one rank (torchrun)")
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("model: has no trainable parameter to shard (set requires_grad before shard_fsdp2)")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    head = model.head
    units = transformer_blocks(model, exclude=[head])
    for block in units:
        fully_shard(block, mesh=mesh)
    if _has_trainable(head):
        # kept unsharded between calls: the head runs many small calls per mask step
        fully_shard(head, mesh=mesh, reshard_after_forward=False)
        for name in HEAD_METHODS:
            if hasattr(head, name):
                register_fsdp_forward_method(head, name)
        units.append(head)
    in_units = {id(p) for unit in units for p in unit.parameters()}
    frozen_rest = {p for p in model.parameters() if not p.requires_grad and id(p) not in in_units}
    fully_shard(model, mesh=mesh, ignored_params=frozen_rest)
    for name in BACKBONE_METHODS:
        register_fsdp_forward_method(model, name)
    return [*units, model]


def _full_options(**extra):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **extra)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, as full tensors. Sharded: a collective every rank must call;
    the tensors are gathered to CPU on rank 0 (the other ranks get an empty dict)."""
    if not is_sharded(model):
        return {name: p for name, p in model.named_parameters() if p.requires_grad}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True, ignore_frozen_params=True))


def load_full_state_dict(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy full tensors (by parameter name, a subset of the model's) into the model, sharding them
    when the model is sharded (every rank passes the same full tensors)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(model, weights, options=_full_options(strict=False))
        return
    own = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            own[name].copy_(value.to(own[name].device))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() with full tensors. Sharded: keyed by parameter name (the layout of
    torch.distributed.checkpoint's full optimizer state dict), a collective, values on rank 0 only."""
    if not is_sharded(model) or not optimizer.state:
        # nothing sharded to gather (an optimizer that has not stepped has no state; asking
        # get_optimizer_state_dict for it would run a zero-gradient step that changes Adam's count)
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a state written by full_optimizer_state, sharded or not, into a sharded or plain model's
    optimizer (the optimizer must hold the same parameters in the same groups)."""
    keyed_by_name = any(isinstance(i, str) for group in state["param_groups"] for i in group["params"])
    if not keyed_by_name and not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not keyed_by_name:
        state = _state_by_name(model, optimizer, state)
    set_optimizer_state_dict(model, optimizer, state, options=_full_options())


def _state_by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """optimizer.state_dict() layout (parameters numbered in group order) -> keyed by parameter name."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = [{**group, "params": [order[i] for i in group["params"]]} for group in state["param_groups"]]
    return {"state": {order[i]: value for i, value in state["state"].items()}, "param_groups": groups}


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (which reduces DTensor gradients over their mesh); returns the
    total norm before clipping as a plain tensor, the same on every rank."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
