"""Hugging Face accelerate on the rustdist backend, on CPU.

    torchrun --nproc-per-node 2 examples/frameworks/accelerate_ddp.py [--backend gloo]

In a multi-CPU run accelerate refuses any backend name but the one it picks, gloo or mpi
(``PartialState(backend="rustdist")``: "Your assigned backend rustdist is not available,
please use gloo"), but it keeps a process group that is already there: initialise it first,
then create the Accelerator. ``cpu=True``
(or ``accelerate launch --cpu``) makes it a multi-CPU run; without it, on a machine with no
GPU, accelerate runs each process alone. Each rank prints its losses and a digest of the
final parameters (tests/test_frameworks.py compares them with gloo's run of this program).
"""

import argparse

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rustdist  # noqa: F401 - registers the backend (torch 2.14+ finds it without this)
from result import report  # this folder's: the line the test reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    args = parser.parse_args()
    dist.init_process_group(args.backend)  # before the Accelerator, which then keeps it
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.state
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # 64 samples; each rank gets its own half (prepare shards the loader)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    report(accelerator.process_index, losses, model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
