"""DDP training of a small MLP on the rustdist backend.

    torchrun --nproc-per-node 2 examples/ddp_mlp.py [--trace DIR]

``import rustdist`` registers the "rustdist" backend with torch.distributed (torch 2.14+ finds
it by name without the import: tests/test_entry_point.py runs this file without it); the rest
is plain PyTorch. Every rank fits the same linear target on its own batches; DDP averages gradients.
With ``--trace DIR`` the last steps run under torch.profiler and each rank writes a Chrome
trace (``DIR/rank<r>.json``; open it in chrome://tracing or https://ui.perfetto.dev), where
DDP's gradient buckets show as ``rustdist:all_reduce`` events with their metadata.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rustdist  # noqa: F401 - registers the "rustdist" torch.distributed backend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", metavar="DIR", help="write each rank's Chrome trace there")
    args = parser.parse_args()
    dist.init_process_group("rustdist")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(123))
    data = torch.Generator().manual_seed(rank)
    steps, traced = 100, 3
    prof = torch.profiler.profile(record_shapes=True) if args.trace else None
    for step in range(steps):
        if prof is not None and step == steps - traced:
            prof.start()
        x = torch.randn(32, 16, generator=data)
        loss = nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if prof is not None:
        prof.stop()
        os.makedirs(args.trace, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.trace, f"rank{rank}.json"))
    # every rank holds the same parameters after DDP training
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    assert all(torch.equal(c, flat) for c in copies), "ranks diverged"
    if rank == 0:
        print(f"backend {dist.get_backend()}, world {world}: final loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
