"""One rank of the shrink programs of tests/test_shrink.py, started as a process of its own:
``python shrink_prog.py KIND RANK WORLD PORT OUT``.

- ``numpy``: rustdist without torch (its own world state): the last rank exits after a first
  all_reduce; the others see it fail, shrink the default group, and check numpy collectives
  and a new group on the shrunk world.
- ``ddp``: DDP through the torch door (``init_process_group("rustdist")``) at world 4; rank 3
  exits at step 5, after which ranks 0-2 shrink the default group, wrap the model in DDP over
  the shrunk group again and finish every step. Each survivor saves its parameters to
  ``OUT/params-<rank>.pt`` so that the driver can check that they agree.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

KIND, RANK, WORLD, PORT, OUT = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
STEPS, DIES_AT = 12, 5


def numpy_world() -> None:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` now fails
    import numpy as np

    import rustdist as dist

    dist.init_process_group(init_method=f"tcp://127.0.0.1:{PORT}", rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    x = np.ones(1000, dtype=np.float32)
    dist.all_reduce(x)
    assert (x == WORLD).all()
    victim = WORLD - 1
    if RANK == victim:
        os._exit(0)
    try:
        dist.all_reduce(np.ones(4 << 20, dtype=np.float32))
    except dist.DistNetworkError as e:
        assert f"rank {victim}" in str(e), e
    else:
        raise AssertionError("all_reduce returned although a rank died")
    shrunk = dist.shrink_group([victim])
    assert dist.group.WORLD is shrunk and dist.get_world_size() == WORLD - 1
    assert dist.get_rank() == RANK and dist.get_process_group_ranks(shrunk) == list(range(victim))
    n = WORLD - 1
    for size in (1, 1000, 4 << 20):
        y = (np.arange(size, dtype=np.float32) % 89) + RANK
        dist.all_reduce(y)
        want = (np.arange(size, dtype=np.float32) % 89) * n + sum(range(n))
        assert (y == want).all(), f"all_reduce of {size} after the shrink"
    out = np.zeros(n * 5, dtype=np.int64)
    dist.all_gather_into_tensor(out, np.full(5, RANK, dtype=np.int64))
    assert (out == np.repeat(np.arange(n), 5)).all(), out
    pair = dist.new_group([0, 1])  # over the world's store, on the shrunk world
    if RANK < 2:
        z = np.full(7, RANK + 1, dtype=np.int32)
        dist.all_reduce(z, group=pair)
        assert (z == 3).all(), z
    dist.destroy_process_group()


def ddp_world() -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import rustdist  # noqa: F401 - registers the "rustdist" backend

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    dist.init_process_group("rustdist", rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = DDP(module)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    step = 0
    while step < STEPS:
        if step == DIES_AT and RANK == WORLD - 1:
            os._exit(0)
        gen = torch.Generator().manual_seed(1000 * step + RANK)
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        try:
            nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError as e:  # the gradients' all_reduce lost rank WORLD - 1
            assert "rank" in str(e), e
            dist.shrink_group([WORLD - 1])
            model = DDP(module)  # over the shrunk default group
            continue  # the step again, without the lost rank
        opt.step()
        step += 1
    torch.save({k: v.detach() for k, v in module.state_dict().items()},
               os.path.join(OUT, f"params-{RANK}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    {"numpy": numpy_world, "ddp": ddp_world}[KIND]()
