"""Failures, each in its own short-lived world: a peer dying inside and between collectives,
ranks that disagree about a collective, and Work.wait(timeout) on an op nobody joins.

All rustdist-only (gloo's behaviour differs; each skip says how)."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(90)
GLOO_DEAD_PEER = ("gloo raises a plain RuntimeError naming the peer's address, not DistNetworkError "
                  "naming its rank")

#: How fast every survivor must raise once a peer died.
DEAD_PEER_BOUND_S = 2.0


@skip_if_torch(GLOO_DEAD_PEER)
@pytest.mark.parametrize("world,victim", [(3, 1), (4, 3), (4, 0)])
def test_peer_dies_inside_collective(short_world: Callable[..., World], world: int, victim: int) -> None:
    """Survivors are blocked in all_reduce when `victim` calls os._exit(1): each raises
    DistNetworkError naming "rank <victim>" within 2 s of the death, and its next op fails too."""
    w = short_world(world)
    w.run("warmup")
    survivors = [r for r in range(world) if r != victim]
    w.submit("blocked_until_peer_dies", ranks=survivors, victim=victim)
    w.wait_notes(survivors, "blocked_until_peer_dies")
    t_kill = time.monotonic()
    w.exit_rank(victim)
    results = w.collect(survivors, "blocked_until_peer_dies", timeout=30)
    problems = []
    for r, res in zip(survivors, results):
        delay = res["t_err"] - t_kill
        if not res["network"]:
            problems.append(f"rank {r}: raised {res['type']}, not DistNetworkError: {res['msg']}")
        if f"rank {victim}" not in res["msg"]:
            problems.append(f"rank {r}: message does not name 'rank {victim}': {res['msg']}")
        if delay > DEAD_PEER_BOUND_S:
            problems.append(f"rank {r}: raised {delay:.2f} s after rank {victim} died (bound {DEAD_PEER_BOUND_S} s)")
        if res["second"] is None:
            problems.append(f"rank {r}: the next all_reduce succeeded although rank {victim} is dead")
        elif res["second_s"] > DEAD_PEER_BOUND_S:
            problems.append(f"rank {r}: the next all_reduce took {res['second_s']:.2f} s to fail")
    assert not problems, "\n".join(problems)


@skip_if_torch(GLOO_DEAD_PEER)
@pytest.mark.parametrize("world,victim", [(3, 2), (4, 1), (3, 0)])
def test_peer_died_before_collective(short_world: Callable[..., World], world: int, victim: int) -> None:
    """`victim` exits after a completed all_reduce; the survivors' next all_reduce raises
    DistNetworkError naming it within 2 s (measured and asserted in each survivor)."""
    w = short_world(world)
    w.run("warmup")
    w.exit_rank(victim)
    survivors = [r for r in range(world) if r != victim]
    w.run("collective_after_peer_died", ranks=survivors, timeout=30, victim=victim, bound=DEAD_PEER_BOUND_S)


@skip_if_torch(GLOO_DEAD_PEER)
@pytest.mark.parametrize("world,victim", [(3, 2), (4, 0)])
def test_peer_exits_after_its_part(short_world: Callable[..., World], world: int, victim: int) -> None:
    """`victim` is the root of broadcasts (64 KiB, 64 B) and sends to every rank, then exits
    before the others enter them: they still get every byte (checked), and only their next
    all_reduce, which needs it, raises DistNetworkError naming it."""
    w = short_world(world)
    w.run("warmup")
    w.run("exit_cases:give_then_go", ranks=[victim])
    w.exit_rank(victim)
    survivors = [r for r in range(world) if r != victim]
    w.run("exit_cases:take_after_peer_left", ranks=survivors, timeout=30, victim=victim)
    # Only now, all of them done: a group failed on one rank fails on every rank.
    w.run("collective_after_peer_died", ranks=survivors, timeout=30, victim=victim, bound=DEAD_PEER_BOUND_S)


@skip_if_torch("gloo does not check that ranks agree on a collective (it hangs, aborts or mixes data)")
@pytest.mark.parametrize("kind", ["size", "dtype", "op", "collective"])
@pytest.mark.parametrize("world", [2, 3])
def test_mismatch_between_ranks(short_world: Callable[..., World], world: int, kind: str) -> None:
    """Rank 0 differs from the others in element count, dtype, reduce op or collective: every
    rank raises naming what differs (at the call or at the next barrier), never hangs."""
    w = short_world(world, pg_timeout=20.0)
    w.run("warmup")
    w.run("mismatch", timeout=15, kind=kind)


def test_group_timeout_says_timed_out(short_world: Callable[..., World]) -> None:
    """A collective that outlives the group's timeout (2 s) raises DistBackendError saying
    "Timed out" on time."""
    w = short_world(2, pg_timeout=2.0)
    w.run("warmup")
    out = w.run("group_timeout", ranks=[0], timeout=30)[0]
    assert out["type"] == "DistBackendError", out
    assert 1.5 <= out["elapsed"] < 10, out


@skip_if_torch("gloo's Work.is_success() is True after wait(timeout) timed out")
def test_wait_timeout_on_op_nobody_joins(short_world: Callable[..., World]) -> None:
    """wait(timeout=0.5 s) raises; afterwards is_completed() and is_success() are False."""
    w = short_world(2)
    w.run("warmup")
    w.run("wait_timeout", ranks=[0], timeout=20)
