"""Tensor parallelism with DTensor on a 2-D DeviceMesh, on the rustdist backend.

    torchrun --nproc-per-node 4 examples/dtensor_tp.py

The mesh is (dp=2, tp=world/2). Within each tp group an MLP is split Megatron-style: the first
Linear column-wise, the second row-wise, so one all-reduce joins the partial outputs. The
dp groups hold replicas fed different batches. The result is checked against the
unsharded model.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import rustdist  # noqa: F401 - registers the "rustdist" torch.distributed backend


def main() -> None:
    dist.init_process_group("rustdist")
    world = dist.get_world_size()
    if world % 2:
        raise SystemExit("run with an even number of ranks, e.g. --nproc-per-node 4")
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    dp_rank = mesh["dp"].get_local_rank()
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(dp_rank))
    out = model(x)
    out.square().mean().backward()
    ref(x).square().mean().backward()
    torch.testing.assert_close(out, ref(x))
    torch.testing.assert_close(model[0].weight.grad.full_tensor(), ref[0].weight.grad)
    shard = tuple(model[0].weight.to_local().shape)
    print(f"rank {dist.get_rank()} (dp {dp_rank}, tp {mesh['tp'].get_local_rank()}): "
          f"column shard {shard} of {tuple(ref[0].weight.shape)}, output matches")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
