"""Ray Train's TorchTrainer on the rustdist backend, on CPU: 2 workers on a local Ray.

    python examples/frameworks/ray_train.py [--backend gloo]

TorchConfig names the backend; Ray's workers pass it to torch.distributed.init_process_group
before the training function runs. On torch before 2.14 a worker knows the name only once
rustdist is imported, so every Ray worker process imports it as it starts (a
worker_process_setup_hook); torch 2.14+ finds rustdist by its entry point and needs no hook.
Rank 0 gathers every rank's losses and a digest of its final parameters into a file, and
this process prints them (tests/test_frameworks.py compares them with gloo's run of this program).
"""

import argparse
import hashlib
import json
import tempfile

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: torch before 2.14 has no backend entry points: a Ray worker must import rustdist itself.
NEEDS_HOOK = tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 14)


def import_rustdist() -> None:
    import rustdist  # noqa: F401 - registers the "rustdist" torch.distributed backend


def train_loop(config: dict) -> None:
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(  # DDP on the group Ray made
        nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # 64 samples; each rank gets its own half (prepare_data_loader adds a DistributedSampler)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(TensorDataset(x, y), batch_size=8))
    losses = []
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "losses": losses,
            "params": hashlib.sha256(params.numpy().tobytes()).hexdigest()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if mine["rank"] == 0:
        with open(config["results"], "w") as f:
            json.dump(every, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="rustdist")
    args = parser.parse_args()
    hook = {"worker_process_setup_hook": import_rustdist} if NEEDS_HOOK else {}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=hook)
    with tempfile.TemporaryDirectory() as storage:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"results": f"{storage}/results.json"},
            torch_config=TorchConfig(backend=args.backend),
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=storage, name="rustdist"),
        )
        trainer.fit()
        with open(f"{storage}/results.json") as f:
            every = json.load(f)
    for rank in every:
        print("RESULT " + json.dumps({**rank, "setup_hook": NEEDS_HOOK}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
