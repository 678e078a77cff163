"""Cases for tests/test_status.py, run inside the rank processes: a job held in a known state
(some ranks waiting in a collective for another that computes, or that waits in another
group's collective) until the driver, having asked the job what it is doing, sets a key in
the job's store; then the operations finish and their results are checked (the job goes on
unharmed after being asked).

``dist`` is rustdist (the import swap) or torch.distributed with backend "rustdist".
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from harness import ctx

#: The key the driver sets once it has asked (one per scenario run: ``release/<tag>``).
RELEASE = "status-test/release/"


def _job_store(host: str, port: int) -> Any:
    """A client of the job's store: torch's in torch mode (torch's init_process_group made
    it), else rustdist's."""
    if ctx.mode == "torch":
        from torch.distributed import TCPStore
    else:
        from rustdist import TCPStore
    return TCPStore(host, port, None, False, timedelta(seconds=120))


def _wait_for_release(tag: str) -> None:
    _job_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])).wait([RELEASE + tag])


def case_one_rank_computes(dist: Any, rank: int, world: int, busy: int, tag: str) -> list[float]:
    """Every rank but ``busy`` enters an all_reduce; ``busy`` "computes" (waits for the
    driver's key) and then joins it."""
    x = torch.full((4,), float(rank))
    ctx.notify("issuing")
    if rank == busy:
        _wait_for_release(tag)
    dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(world)))] * 4, x
    return x.tolist()


def case_one_rank_in_another_group(dist: Any, rank: int, world: int, tag: str) -> list[float]:
    """Group ``pair`` = [0, last]. Rank 0 issues the world's all_reduce asynchronously and then
    waits for the driver's key before its part of the pair's all_reduce; the last rank
    waits in the pair's all_reduce (for rank 0) before the world's; the others wait in the
    world's all_reduce (for the last rank)."""
    last = world - 1
    pair = dist.new_group([0, last])
    x = torch.full((4,), float(rank))
    y = torch.full((4,), float(rank))
    if rank == last:
        ctx.notify("issuing")
        dist.all_reduce(y, group=pair)
        dist.all_reduce(x)
    elif rank == 0:
        work = dist.all_reduce(x, async_op=True)
        ctx.notify("issuing")
        _wait_for_release(tag)
        dist.all_reduce(y, group=pair)
        work.wait()
    else:
        ctx.notify("issuing")
        dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(world)))] * 4, x
    if rank in (0, last):
        assert y.tolist() == [float(last)] * 4, y
    dist.destroy_process_group(pair)
    return x.tolist()


def case_known_traffic(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """On a fresh group of every rank: 3 all_reduces of 4 float32, 2 broadcasts of 8 int64
    and a barrier; returns its counters (``dist.stats``, or rustdist's through the torch
    door) and keeps the group for the status query."""
    import rustdist

    group = dist.new_group(list(range(world)))
    for _ in range(3):
        dist.all_reduce(torch.ones(4), group=group)
    for _ in range(2):
        dist.broadcast(torch.arange(8), 0, group=group)
    dist.barrier(group=group)
    ctx.state["counted"] = group
    return rustdist.stats(group)


def case_forget_known_traffic(dist: Any, rank: int, world: int) -> None:
    dist.destroy_process_group(ctx.state.pop("counted"))
