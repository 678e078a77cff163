"""DDP training with uneven inputs: ``Join``, gradient accumulation with ``no_sync``, then
fine-tuning with a ``ZeroRedundancyOptimizer`` (optimizer state sharded across the ranks).

    torchrun --nproc-per-node 2 examples/ddp_join_zero.py
    python examples/ddp_join_zero.py --world 4

Written for torch.distributed on gloo; swap the import line below for
``import rustdist as dist`` and the same program runs on rustdist's engine.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from launch import run

ACCUMULATE = 2  # micro-batches per optimizer step in the first phase


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4)))
    target = torch.randn(16, 4, generator=torch.Generator().manual_seed(123))
    data = torch.Generator().manual_seed(rank)
    batches = 8 + 2 * rank  # uneven: later ranks have more data

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(model(x), x @ target)

    # Phase 1: gradients of ACCUMULATE micro-batches are all-reduced once.
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with Join([model]):
        for step in range(batches):
            x = torch.randn(32, 16, generator=data)
            if step % ACCUMULATE == ACCUMULATE - 1 or step == batches - 1:
                loss_of(x).backward()
                opt.step()
                opt.zero_grad()
            else:
                with model.no_sync():
                    loss_of(x).backward()

    # Phase 2: each rank keeps 1/world of the optimizer state; ZeRO broadcasts the update.
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=5e-3)
    with Join([model, zero]):
        for _ in range(batches):
            loss_of(torch.randn(32, 16, generator=data)).backward()
            zero.step()
            zero.zero_grad()
    zero.consolidate_state_dict(to=0)
    if rank == 0:
        steps = zero.state_dict()["state"][0]["step"]
        print(f"world {world}: {batches} to {8 + 2 * (world - 1)} batches per rank, "
              f"ZeRO state consolidated on rank 0 after {int(steps)} steps")
    if args.save_dir:
        params = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
        torch.save(params, os.path.join(args.save_dir, f"params-rank{rank}.pt"))
    # DDP and ZeRO talk to the group while they are torn down: release them first (gloo can
    # hang at exit when they outlive destroy_process_group).
    del zero, opt, model
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main, __doc__)
