"""What each example program of this folder prints at its end, for tests/test_frameworks.py to
compare with gloo's run of the same program."""

import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn


def report(rank: int, losses: list[float], model: nn.Module) -> None:
    """One line per rank: the backend torch.distributed runs on, the losses, and a digest of
    the final parameters' bits (equal on every rank when gradients were synchronised)."""
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    print("RESULT " + json.dumps({
        "rank": rank, "world": dist.get_world_size(), "backend": dist.get_backend(),
        "losses": losses, "params": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    }), flush=True)
