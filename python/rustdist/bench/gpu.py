"""``--device cuda``: rustdist's NCCL path (``import rustdist as dist`` with CUDA tensors,
backend "nccl", which rustdist runs) against torch's own ProcessGroupNCCL (a
``torch.distributed.new_group(backend="nccl")`` of the same ranks), one GPU per rank."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

from .sides import Side, torch_side


def cuda_problem(world: int) -> Optional[str]:
    """Why a CUDA world of `world` ranks cannot run here, or None."""
    import torch

    import rustdist.cuda as rcuda

    if not torch.cuda.is_available():
        return ("no CUDA device: --device cuda needs a GPU that torch sees "
                "(torch.cuda.is_available() is False)")
    if not rcuda.is_available():
        return f"no CUDA device for rustdist: it cannot load CUDA and NCCL ({rcuda.load_report()})"
    gpus = torch.cuda.device_count()
    if world > gpus:
        return (f"--device cuda --world {world} needs {world} GPUs, one per rank (torch's NCCL "
                f"refuses two ranks on one GPU); this machine has {gpus}")
    return None


def cuda_sides(rank: int, timeout: timedelta
               ) -> tuple[list[Side], Callable[[], Any], Callable[[], Any]]:
    """This rank's sides (rustdist on its default group, torch's NCCL on a group of every
    rank), the barrier both share (rustdist's, on the host) and the device sync."""
    import torch
    import torch.distributed as td

    import rustdist as rd

    torch.cuda.set_device(rank)  # one host: local rank = rank
    device = f"cuda:{rank}"
    nccl = td.new_group(backend="nccl", timeout=timeout)
    sides = [torch_side("rustdist", rd, device=device),
             torch_side("torch_nccl", td, group=nccl, device=device)]
    return sides, rd.barrier, torch.cuda.synchronize
