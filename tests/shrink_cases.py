"""Cases for tests/test_shrink.py: the survivors of a rank that died in the middle of a large
collective shrink the group and go on, checked element by element; pending work on the group
being shrunk is refused or aborted. Each runs on the ranks the driver names."""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

from dist_cases import check
from harness import ctx

#: Large enough that frames are in flight between survivors when the victim dies.
IN_FLIGHT = 4 << 20


def _values(rank: int, n: int) -> torch.Tensor:
    """Rank `rank`'s input: integer-valued floats, so that sums are exact."""
    return (torch.arange(n, dtype=torch.float32) % 97) + rank


def _sum_of(n: int, size: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float32) % 97) * size + sum(range(size))


def _check_group(dist: Any, group: Optional[Any] = None) -> None:
    """Every kind of operation on `group` (default: the default group) gives the reference
    result, element by element."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    for n in (1, 1000, IN_FLIGHT):
        t = _values(me, n)
        dist.all_reduce(t, group=group)
        check(t, _sum_of(n, size), f"all_reduce of {n} on the shrunk group")
    for root in range(size):
        t = _values(me, 333)
        dist.broadcast(t, group=group, group_src=root)
        check(t, _values(root, 333), f"broadcast from group rank {root}")
    out = torch.empty(size * 77)
    dist.all_gather_into_tensor(out, _values(me, 77), group=group)
    check(out, torch.cat([_values(r, 77) for r in range(size)]), "all_gather_into_tensor")
    got = torch.empty(55)
    dist.reduce_scatter_tensor(got, _values(me, 55 * size), group=group)
    check(got, _sum_of(55 * size, size)[me * 55:(me + 1) * 55], "reduce_scatter_tensor")
    nxt, prv = (me + 1) % size, (me - 1) % size
    inbox = torch.empty(41)
    works = [dist.isend(_values(me, 41), group=group, group_dst=nxt, tag=3),
             dist.irecv(inbox, group=group, group_src=prv, tag=3)]
    for w in works:
        w.wait()
    check(inbox, _values(prv, 41), "isend/irecv around the ring")
    dist.barrier(group=group)


def case_shrink_after_death(dist: Any, rank: int, world: int, victim: int,
                            new_group: bool) -> dict[str, Any]:
    """Blocks in a large all_reduce until `victim` dies (the driver kills it once every
    survivor has said it is entering), then shrinks the default group excluding it and checks
    the new default group: ranks renumbered in order, global ranks kept, every operation
    right. With `new_group`, a group made after the shrink works too. Returns when the
    all_reduce failed, the shrink returned and the first collective on the new group ended."""
    ctx.notify("entering")
    big = torch.ones(IN_FLIGHT)
    try:
        dist.all_reduce(big)
    except RuntimeError as e:
        t_err, err = time.monotonic(), e
    else:
        raise AssertionError(f"rank {rank}: all_reduce returned although rank {victim} died")
    shrunk = dist.shrink_group([victim])
    t_shrunk = time.monotonic()
    probe = torch.ones(4)
    dist.all_reduce(probe)
    t_first = time.monotonic()
    check(probe, torch.full((4,), float(world - 1)), "the first all_reduce after the shrink")
    assert dist.group.WORLD is shrunk, "the shrunk group is the default group"
    me = rank - (rank > victim)
    assert (dist.get_rank(), dist.get_world_size()) == (me, world - 1), (
        f"rank {rank}: rank {dist.get_rank()} of {dist.get_world_size()} after the shrink")
    survivors = [r for r in range(world) if r != victim]
    assert dist.get_process_group_ranks(shrunk) == survivors, dist.get_process_group_ranks(shrunk)
    _check_group(dist)
    if new_group:  # every survivor makes it, over the store the world was made on
        pair = dist.new_group([0, 1])
        if me < 2:
            _check_group(dist, pair)
        dist.destroy_process_group(pair)
    return {"t_err": t_err, "t_shrunk": t_shrunk, "t_first": t_first,
            "error": f"{type(err).__name__}: {err}"}


def case_shrink_subgroup(dist: Any, rank: int, world: int, members: list[int],
                         victim: int) -> None:
    """Every rank makes a subgroup of `members`; once `victim` (a member) has died, the other
    members shrink the subgroup (not the default group) and use it; the default group is left
    as it is."""
    sub = dist.new_group(members)
    if rank not in members:
        return
    _check_group(dist, sub)
    ctx.notify("ready")
    if rank == victim:
        return  # idle, so that the driver can make it exit
    while True:  # until the victim's death reaches this member
        try:
            dist.all_reduce(torch.ones(1000), group=sub)
        except RuntimeError:
            break
    shrunk = dist.shrink_group([members.index(victim)], group=sub)
    kept = [m for m in members if m != victim]
    assert dist.get_process_group_ranks(shrunk) == kept, dist.get_process_group_ranks(shrunk)
    assert dist.get_rank(shrunk) == kept.index(rank)
    _check_group(dist, shrunk)
    assert dist.group.WORLD is not shrunk


def case_shrink_pending(dist: Any, rank: int, world: int, victim: int) -> None:
    """A receive from `victim`, which lives but takes no part, is pending: shrink_group with
    SHRINK_DEFAULT raises on rank 0 saying operations are pending (the group is untouched),
    SHRINK_ABORT aborts the receive and shrinks, excluding a rank that is alive. The others
    abort only after rank 0's refusal: an abort fails the group on every rank, and a failed
    group's pending work no longer stops a shrink."""
    inbox = torch.empty(8)
    pending = dist.irecv(inbox, src=victim, tag=11)
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        # Every other rank has its receive posted before the abort fails the group.
        store.wait([f"shrink_pending/posted/{r}" for r in range(1, world) if r != victim])
        try:
            dist.shrink_group([victim])
        except RuntimeError as e:
            assert "pending" in str(e) and "SHRINK_ABORT" in str(e), e
        else:
            raise AssertionError("shrink_group with a receive pending did not raise")
        store.set("shrink_pending/refused", "1")
    else:
        store.set(f"shrink_pending/posted/{rank}", "1")
        store.wait(["shrink_pending/refused"])
    shrunk = dist.shrink_group([victim], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    try:
        pending.wait()
    except RuntimeError as e:
        assert "abort" in str(e), e
    else:
        raise AssertionError("the pending receive completed although its sender died")
    _check_group(dist, shrunk)
