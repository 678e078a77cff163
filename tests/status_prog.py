"""A job for tests/test_status.py: rank 1 "computes" (waits for a key the test sets once it
has asked the job) while the other ranks wait in an all_reduce; then the all_reduce's result is
checked. By default through the torch door (under torchrun: on torchrun's store); with the
argument ``swap``, through the import swap (on rustdist's store, which RUSTDIST_AUTH_KEY
guards)."""

import os
import sys
from datetime import timedelta

import torch

import rustdist

if sys.argv[1:] == ["swap"]:
    dist = rustdist
else:
    import torch.distributed as dist

#: The key the test sets once it has asked the job.
RELEASE = os.environ["RUSTDIST_TEST_RELEASE"]

dist.init_process_group("rustdist" if dist is not rustdist else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 1:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                          timedelta(seconds=120))
    store.wait([RELEASE])
x = torch.full((4,), float(rank))
dist.all_reduce(x)
assert x.tolist() == [float(sum(range(world)))] * 4, x
print(f"rank {rank}: all_reduce ok", flush=True)
dist.destroy_process_group()
