"""Cases for a rank that does its part of some operations and exits before the others have
entered them (tests/test_failures.py): what it sent must still arrive."""

from __future__ import annotations

from typing import Any

import torch

from dist_cases import check

#: Broadcast sizes in bytes: a shared-memory workspace slot's worth first (the root may write
#: a slot only once every rank has finished the step before), then 64 B (inline in the flag
#: line, which the root may run ahead with). Over TCP both fit the socket buffers, so the root
#: returns before anyone reads.
SIZES = (64 << 10, 64)


def _payload(size: int, salt: int) -> torch.Tensor:
    return (torch.arange(size // 4, dtype=torch.int32) * 7 + salt) % 1021


def case_give_then_go(dist: Any, rank: int, world: int) -> None:
    """The leaving rank: the root of one broadcast per size, then a send to every other rank."""
    for size in SIZES:
        dist.broadcast(_payload(size, rank), src=rank)
    for peer in range(world):
        if peer != rank:
            dist.send(_payload(4096, peer), dst=peer)


def case_take_after_peer_left(dist: Any, rank: int, world: int, victim: int) -> None:
    """The others, entering after `victim` exited: every broadcast and receive from it is
    whole. First a token passes from each of them to the next, so that the last waits (and
    sleeps) for it while `victim`, which it does not need, is gone."""
    others = [r for r in range(world) if r != victim]
    at = others.index(rank)
    token = torch.zeros(16, dtype=torch.int64)
    if at > 0:
        dist.recv(token, src=others[at - 1])
        check(token, torch.full((16,), at - 1, dtype=torch.int64), f"token from rank {others[at - 1]}")
    if at + 1 < len(others):
        dist.send(torch.full((16,), at, dtype=torch.int64), dst=others[at + 1])
    for size in SIZES:
        got = torch.zeros(size // 4, dtype=torch.int32)
        dist.broadcast(got, src=victim)
        check(got, _payload(size, victim), f"broadcast of {size} B from rank {victim}, which exited")
    got = torch.zeros(1024, dtype=torch.int32)
    dist.recv(got, src=victim)
    check(got, _payload(4096, rank), f"receive from rank {victim}, which exited")
