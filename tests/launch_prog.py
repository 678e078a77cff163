"""A rustdist program as a user writes it for any launcher (tests/test_launchers.py):
``import rustdist as dist; dist.init_process_group()`` and nothing else to configure.

With ``--die-in-first-attempt``, rank 1 exits after its first collective in torchrun's first
attempt, so that torchrun restarts the group."""

import os
import sys

import torch

import rustdist as dist

dist.init_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [world * (world + 1) / 2] * 4, t
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if "--die-in-first-attempt" in sys.argv and attempt == 0 and rank == 1:
    os._exit(3)
dist.barrier()
print(f"rank {rank} of {world}, local rank {dist.get_node_local_rank()}, attempt {attempt}: ok",
      flush=True)
dist.destroy_process_group()
