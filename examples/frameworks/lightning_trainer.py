"""Lightning's Trainer with DDP on the rustdist backend, on CPU.

    python examples/frameworks/lightning_trainer.py [--backend gloo]

The Trainer starts the second process itself (DDPStrategy's default start_method "popen":
it runs this script again); under torchrun it uses torchrun's processes instead. The
backend is named in DDPStrategy, which passes it to torch.distributed.init_process_group as
it is. Each rank prints its losses and a digest of the final parameters
(tests/test_frameworks.py compares them with gloo's run of this program).
"""

import argparse

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import rustdist  # noqa: F401 - registers the backend (torch 2.14+ finds it without this)
from result import report  # this folder's: the line the test reads


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.losses: list[float] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    args = parser.parse_args()
    trainer = L.Trainer(accelerator="cpu", devices=2, max_epochs=1,
                        strategy=DDPStrategy(process_group_backend=args.backend),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    # 64 samples; each rank gets its own half (the Trainer adds a DistributedSampler)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    model = Regression()
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8))
    report(trainer.global_rank, model.losses, model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
