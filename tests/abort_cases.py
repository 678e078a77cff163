"""Cases of ProcessGroup.abort() and _abort_process_group, run inside the rank processes.

The driver names them ``"abort_cases:<name>"`` (see harness.find_case); each case is
``case_<name>(dist, rank, world, **params)`` like those of dist_cases. ``dist`` is rustdist or
torch.distributed: both have ``group.WORLD.abort()`` and
``distributed_c10d._abort_process_group``, which in torch mode with backend "rustdist" reach
rustdist's ``ProcessGroup.abort()``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import torch

from dist_cases import check, expect_raises, sanity
from harness import ctx

#: What the message of every error caused by an abort must say.
ABORTED = r"abort"
#: How long a thread blocked in a call may take to leave it by itself: longer than any bound
#: a test asserts, shorter than the groups' timeout (15 s), so that a hang shows as a failed
#: assertion rather than as the op's own timeout.
JOIN_S = 10.0
#: A bounded join that must time out: the thread is still inside its call (not a
#: synchronisation: an abort that comes first fails the call all the same).
STILL_BLOCKED_S = 0.2


class _Blocked(threading.Thread):
    """Runs ``call`` on a thread of its own; records when and how it ended."""

    def __init__(self, what: str, call: Callable[[], Any]) -> None:
        super().__init__(name=what, daemon=True)
        self.what = what
        self.call = call
        self.started = threading.Event()
        self.error: Optional[BaseException] = None
        self.returned = False
        self.t_end = 0.0

    def run(self) -> None:
        self.started.set()
        try:
            self.call()
            self.returned = True
        except BaseException as e:  # noqa: BLE001 - the case checks it
            self.error = e
        self.t_end = time.monotonic()


def _start(what: str, call: Callable[[], Any]) -> _Blocked:
    th = _Blocked(what, call)
    th.start()
    assert th.started.wait(JOIN_S), f"thread {what!r} did not start within {JOIN_S} s"
    th.join(STILL_BLOCKED_S)
    assert th.is_alive(), (
        f"{th.what} ended before anything was aborted (returned={th.returned}, "
        f"error={th.error!r}): the peers never join it, it should block")
    return th


def _error_of(dist: Any, rank: int, th: _Blocked, t_abort: Optional[float], bound: float,
              peer: Optional[int] = None) -> dict[str, Any]:
    """Checks that ``th`` raised DistBackendError saying the group was aborted (and naming
    ``rank <peer>`` when given), within ``bound`` s of ``t_abort`` when given; returns what it
    saw, with when it raised (``t_end``, time.monotonic())."""
    th.join(JOIN_S)
    where = f"rank {rank}: {th.what}"
    assert not th.is_alive(), f"{where} still blocked {JOIN_S} s after the abort"
    assert not th.returned, f"{where} returned normally although the group was aborted"
    err = th.error
    assert isinstance(err, dist.DistBackendError), (
        f"{where} raised {type(err).__name__}, not DistBackendError: {err}")
    assert re.search(ABORTED, str(err), re.IGNORECASE), (
        f"{where}: the message does not say the group was aborted: {err}")
    if peer is not None:
        assert f"rank {peer}" in str(err), f"{where}: the message does not name rank {peer}: {err}"
    seen: dict[str, Any] = {"what": th.what, "type": type(err).__name__, "msg": str(err),
                            "t_end": th.t_end}
    if t_abort is not None:
        seen["delay"] = delay = th.t_end - t_abort
        assert delay < bound, f"{where} raised {delay:.3f} s after the abort (bound {bound} s)"
    return seen


def _expect_aborted(fn: Callable[[], Any], what: str) -> BaseException:
    """Calls ``fn``, asserts it raises because of an abort: a DistBackendError saying so, or
    (torch.distributed on a group it forgot) the ValueError its c10d logger raises while
    reporting that DistBackendError, which is then the ValueError's context."""
    import torch.distributed as td

    try:
        fn()
    except Exception as e:  # noqa: BLE001 - checked below
        err: Optional[BaseException] = e
        chain = []
        while err is not None:
            chain.append(f"{type(err).__name__}: {err}")
            if isinstance(err, td.DistBackendError) and re.search(ABORTED, str(err), re.I):
                return e
            err = err.__cause__ or err.__context__
        raise AssertionError(f"{what}: no DistBackendError saying the group was aborted in "
                             f"the exception chain: {' <- '.join(chain)}") from e
    raise AssertionError(f"{what}: returned normally although the group was aborted")


def _world_group(dist: Any) -> Any:
    pg = dist.group.WORLD
    assert pg is not None, "group.WORLD is None in an initialised world"
    return pg


def case_abort_wakes_local_waiters(dist: Any, rank: int, world: int, bound: float) -> dict[str, Any]:
    """Run by rank 0 alone (its peers never join): a thread blocked in a synchronous
    all_reduce and a thread blocked in ``work.wait()`` of an async all_reduce; the main
    thread calls ``group.WORLD.abort()``. Both raise DistBackendError saying "aborted" within
    ``bound`` s, the Work then reports completed without success, and a new collective on the
    group fails at once the same way."""
    pg = _world_group(dist)
    sync = _start("synchronous all_reduce", lambda: dist.all_reduce(torch.ones(16)))
    work = dist.all_reduce(torch.ones(32), async_op=True)
    waiter = _start("work.wait() of an async all_reduce", work.wait)
    assert not work.is_completed(), "the async all_reduce completed although no peer joined it"
    t_abort = time.monotonic()
    pg.abort()
    abort_call_s = time.monotonic() - t_abort
    seen = [_error_of(dist, rank, th, t_abort, bound) for th in (sync, waiter)]
    assert work.is_completed(), "work.is_completed() is False after the abort failed it"
    assert not work.is_success(), "work.is_success() is True after the abort failed it"
    t0 = time.monotonic()
    expect_raises(dist.DistBackendError, ABORTED, lambda: dist.all_reduce(torch.ones(4)),
                  "all_reduce on the aborted group")
    later_s = time.monotonic() - t0
    assert later_s < bound, f"all_reduce on the aborted group took {later_s:.3f} s to fail"
    return {"errors": seen, "abort_call_s": abort_call_s, "later_s": later_s}


def case_blocked_until_peer_aborts(dist: Any, rank: int, world: int, aborter: int) -> dict[str, Any]:
    """Every rank but `aborter`: an async all_reduce whose ``wait()`` blocks on a thread, and
    a synchronous all_reduce blocked on another thread, both on the world group, which
    `aborter` never joins. Tells the driver (which then makes `aborter` abort) and checks that
    both raise DistBackendError saying "aborted" and naming the aborter; returns when they
    raised, for the driver to compare with the abort (time.monotonic() is the host's clock,
    comparable between processes)."""
    work = dist.all_reduce(torch.ones(32), async_op=True)
    waiter = _start("work.wait() of an async all_reduce", work.wait)
    sync = _start("synchronous all_reduce", lambda: dist.all_reduce(torch.ones(16)))
    ctx.notify("blocked")
    return {"errors": [_error_of(dist, rank, th, None, 0.0, peer=aborter) for th in (waiter, sync)]}


def case_abort_world_group(dist: Any, rank: int, world: int) -> float:
    """``group.WORLD.abort()``; returns when it was called (time.monotonic())."""
    pg = _world_group(dist)
    t = time.monotonic()
    pg.abort()
    return t


def _init(dist: Any, rank: int, world: int, port: int) -> None:
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(ctx.backend, init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))


def case_init_with_subgroups(dist: Any, rank: int, world: int, port: int) -> None:
    """Phase 1 of the re-init test: init on `port`, two subgroups (all ranks; ranks 0 and 1),
    a collective on each. Kept in ctx.state for phase 2."""
    assert not dist.is_initialized(), "the world was initialised before the case"
    _init(dist, rank, world, port)
    everyone = dist.new_group(list(range(world)))
    pair = dist.new_group([0, 1])
    for g, members in ((None, list(range(world))), (everyone, list(range(world))), (pair, [0, 1])):
        if rank not in members:
            continue
        t = torch.full((3,), rank + 1, dtype=torch.int64)
        dist.all_reduce(t, group=g)
        check(t, torch.full((3,), sum(r + 1 for r in members), dtype=torch.int64),
              f"all_reduce on group of ranks {members} before the abort")
    if ctx.mode == "torch":  # rustdist's functions on torch's world (rustdist caches it)
        import rustdist

        t = torch.ones(2)
        rustdist.all_reduce(t)
        check(t, torch.full((2,), float(world)), "rustdist.all_reduce on torch's world")
    ctx.state["abort_groups"] = (everyone, pair)


def case_abort_subgroup(dist: Any, rank: int, world: int) -> None:
    """Phase 2: ``_abort_process_group(pair)`` on its members (a no-op with NON_GROUP_MEMBER
    on the others) aborts and forgets that group alone: an op on it fails because of the abort
    (torch.distributed: its logger then raises ValueError, the group being unknown),
    aborting it again raises ValueError (unknown group), the world and the other subgroup
    still work."""
    everyone, pair = ctx.state["abort_groups"]
    c10d = dist.distributed_c10d
    c10d._abort_process_group(pair)
    assert dist.is_initialized(), "_abort_process_group(subgroup) deinitialised the world"
    if rank in (0, 1):
        _expect_aborted(lambda: dist.all_reduce(torch.ones(3), group=pair),
                        "all_reduce on the aborted subgroup")
        expect_raises(ValueError, r"invalid|destroyed",
                      lambda: c10d._abort_process_group(pair),
                      "_abort_process_group on a subgroup aborted already")
    t = torch.ones(3)
    dist.all_reduce(t, group=everyone)
    check(t, torch.full((3,), float(world)), "all_reduce on the other subgroup after the abort")
    sanity(dist, world)


def case_abort_world_and_reinit(dist: Any, rank: int, world: int, port: int) -> dict[str, Any]:
    """Phase 3: ``_abort_process_group()`` (None: the world) with an async all_reduce pending on
    the surviving subgroup on rank 0 (its peers never join it): the Work fails saying
    "aborted", the world is uninitialised (get_rank raises ValueError), and
    ``init_process_group`` on a fresh port (`port`) gives a working world and subgroups."""
    everyone, _ = ctx.state.pop("abort_groups")
    c10d = dist.distributed_c10d
    pending = dist.all_reduce(torch.ones(8), group=everyone, async_op=True) if rank == 0 else None
    t0 = time.monotonic()
    c10d._abort_process_group()
    abort_s = time.monotonic() - t0
    assert not dist.is_initialized(), "is_initialized() is True after _abort_process_group()"
    expect_raises(ValueError, r"not been initialized|init_process_group", lambda: dist.get_rank(),
                  "get_rank() after _abort_process_group()")
    if pending is not None:
        expect_raises(RuntimeError, ABORTED, pending.wait,
                      "wait() of the all_reduce pending on a subgroup when the world was aborted")
    _init(dist, rank, world, port)
    assert dist.get_rank() == rank and dist.get_world_size() == world, (
        f"after re-init: rank {dist.get_rank()} of {dist.get_world_size()}, expected {rank} of {world}")
    t = torch.full((5,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t)
    check(t, torch.full((5,), world * (world + 1) // 2, dtype=torch.int64),
          "all_reduce on the world made after _abort_process_group()")
    g = dist.new_group(list(range(world)))
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    check(t, torch.full((2,), float(world)), "all_reduce on a subgroup made after the re-init")
    if ctx.mode == "torch":
        # torch's _abort_process_group aborted rustdist's groups behind rustdist's back:
        # rustdist's own functions must use the new world, not a cached aborted group.
        import rustdist

        t = torch.ones(2)
        rustdist.all_reduce(t)
        check(t, torch.full((2,), float(world)), "rustdist.all_reduce on the world torch made "
              "after its _abort_process_group()")
        assert rustdist.group.WORLD is dist.group.WORLD, (
            f"rustdist.group.WORLD {rustdist.group.WORLD!r} is not torch's new default group "
            f"{dist.group.WORLD!r}")
    dist.barrier()
    dist.destroy_process_group()
    assert not dist.is_initialized(), "is_initialized() after destroy_process_group()"
    return {"abort_s": abort_s}
