"""Lightning Fabric's DDP on the rustdist backend, on CPU.

    python examples/frameworks/lightning_fabric.py [--backend gloo]

Fabric starts the second process itself (it runs this script again, with LOCAL_RANK set);
under torchrun it uses torchrun's processes instead. The backend is named in DDPStrategy;
Fabric passes it to torch.distributed.init_process_group as it is. Each rank prints its
losses and a digest of the final parameters (tests/test_frameworks.py compares them with
gloo's run of this program).
"""

import argparse

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rustdist  # noqa: F401 - registers the backend (torch 2.14+ finds it without this)
from result import report  # this folder's: the line the test reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    args = parser.parse_args()
    fabric = L.Fabric(accelerator="cpu", devices=2,
                      strategy=DDPStrategy(process_group_backend=args.backend))
    fabric.launch()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    # 64 samples; each rank gets its own half (Fabric adds a DistributedSampler)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=8))
    losses = []
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    report(fabric.global_rank, losses, model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
