"""DeepSpeed ZeRO (stage 2; ``--stage 1``: stage 1) training on the rustdist backend, on CPU.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 examples/frameworks/deepspeed_zero.py

deepspeed.init_distributed passes dist_backend to torch.distributed.init_process_group as it
is. DS_ACCELERATOR=cpu: DeepSpeed's CPU accelerator, also where it sees a GPU (where it sees
none it falls back to it, with a warning). Each rank prints its losses and a digest of the
final parameters (tests/test_frameworks.py compares them with ``--backend gloo``'s run).
"""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

import rustdist  # noqa: F401 - registers the backend (torch 2.14+ finds it without this)
from result import report  # this folder's: the line the test reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    parser.add_argument("--stage", type=int, default=2)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,  # torch's SGD (DeepSpeed lists Adam and a few)
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    # 64 samples; each rank takes its own half, 8 at a time
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    losses = []
    for step in range(4):
        i = (step * world + rank) * 8
        loss = nn.functional.mse_loss(engine(x[i:i + 8]), y[i:i + 8])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    report(rank, losses, engine.module)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
