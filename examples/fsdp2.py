"""FSDP2 (``fully_shard``) training on the rustdist backend.

    torchrun --nproc-per-node 2 examples/fsdp2.py

Each Linear layer and the whole model are sharded across the ranks: parameters are
all-gathered for forward and backward, gradients reduce-scattered, on rustdist's engine.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import rustdist  # noqa: F401 - registers the "rustdist" torch.distributed backend


def main() -> None:
    dist.init_process_group("rustdist")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(123))
    data = torch.Generator().manual_seed(rank)
    for _ in range(50):
        x = torch.randn(32, 16, generator=data)
        loss = nn.functional.mse_loss(model(x), x @ target)
        loss.backward()
        opt.step()
        opt.zero_grad()
    local = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"backend {dist.get_backend()}, world {world}: {local} of {total} parameters "
              f"on this rank, final loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
