"""torch.distributed plumbing for torchrun: init from the environment, gradient averaging (DDP
semantics without wrapping the backbone, whose forward is not a single nn.Module call), and
metric/reward gathering. Every function is a no-op in a single process."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


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


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
