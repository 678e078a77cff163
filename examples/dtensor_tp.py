"""Tensor parallelism with DTensor on a 2-D DeviceMesh (data parallel x tensor parallel).

    torchrun --nproc-per-node 4 examples/dtensor_tp.py
    python examples/dtensor_tp.py --world 2

The mesh is (dp, tp) = (world / 2, 2). Within each tp group an MLP is split Megatron-style:
the first Linear column-wise, the second row-wise, so one all-reduce joins the partial
outputs; the dp groups hold replicas fed different batches, whose gradients are averaged
over dp. The first step is checked against the unsharded model. Written for
torch.distributed on gloo; swap the import line below for ``import rustdist as dist`` and
the same program runs on rustdist's engine.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from launch import run


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = dist.init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    dp_rank, dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
    data = torch.Generator().manual_seed(dp_rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5):
        x = torch.randn(8, 32, generator=data)
        out = model(x)
        out.square().mean().backward()
        if step == 0:
            ref(x).square().mean().backward()
            torch.testing.assert_close(out, ref(x))
            torch.testing.assert_close(model[0].weight.grad.full_tensor(), ref[0].weight.grad)
        for p in model.parameters():  # data parallel: average the local shards over dp
            dist.all_reduce(p.grad.to_local(), op=dist.ReduceOp.SUM, group=dp_group)
            p.grad.to_local().div_(world // 2)
        opt.step()
        opt.zero_grad()
    params = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if args.save_dir:
        torch.save(params, os.path.join(args.save_dir, f"params-rank{dist.get_rank()}.pt"))
    shard = tuple(model[0].weight.to_local().shape)
    print(f"rank {dist.get_rank()} (dp {dp_rank}, tp {mesh['tp'].get_local_rank()}): column "
          f"shard {shard} of {tuple(ref[0].weight.shape)}, first step matches the unsharded model")
    dist.destroy_process_group()


if __name__ == "__main__":
    run(main, __doc__)
