"""FSDP2 (``fully_shard``) training with a ``torch.distributed.checkpoint`` save, a load into
a fresh sharded model, and more training from there.

    torchrun --nproc-per-node 2 examples/fsdp2_checkpoint.py
    python examples/fsdp2_checkpoint.py --world 4

Parameters are all-gathered for forward and backward and gradients reduce-scattered; the
checkpoint is written shard by shard. Written for torch.distributed on gloo; swap the import
line below for ``import rustdist as dist`` and the same program runs on rustdist's engine.
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from launch import run


def sharded_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model: nn.Module, opt: torch.optim.Optimizer, data: torch.Generator,
          steps: int) -> float:
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(123))
    for _ in range(steps):
        x = torch.randn(32, 16, generator=data)
        loss = nn.functional.mse_loss(model(x), x @ target)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    where = [args.save_dir or tempfile.mkdtemp(prefix="fsdp2-ckpt-")]
    dist.broadcast_object_list(where, src=0)
    ckpt = os.path.join(where[0], "checkpoint")
    data = torch.Generator().manual_seed(rank)
    model, opt = sharded_model()
    train(model, opt, data, 10)
    model_sd, opt_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=ckpt)

    # A fresh model and optimizer, restored from the checkpoint, continue the training.
    restored, restored_opt = sharded_model()
    model_sd, opt_sd = get_state_dict(restored, restored_opt)
    state = {"model": model_sd, "optim": opt_sd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(restored, restored_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    for a, b in zip(model.parameters(), restored.parameters()):
        torch.testing.assert_close(a.full_tensor(), b.full_tensor(), rtol=0, atol=0)
    loss = train(restored, restored_opt, data, 10)
    params = {k: v.full_tensor() for k, v in restored.state_dict().items()}
    if args.save_dir:
        torch.save(params, os.path.join(args.save_dir, f"params-rank{rank}.pt"))
    if rank == 0:
        local = sum(p.to_local().numel() for p in restored.parameters())
        print(f"world {world}: {local} of {sum(v.numel() for v in params.values())} parameters "
              f"on rank 0, checkpoint restored, final loss {loss:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main, __doc__)
