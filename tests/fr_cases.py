"""Cases for tests/test_flight_recorder.py, run inside the rank processes of worlds that have
not initialised a process group (``World(init=False)``): ``setup`` sets the flight recorder's
and the heartbeats' variables, initialises with a short timeout, makes the scenario's groups and
warms them up; then one scenario case breaks the job the way its name says and returns what
each rank saw (the exception it raised, whether its dump was there when it returned).

The driver names them ``"fr_cases:<name>"`` (see harness.find_case). ``dist`` is rustdist or
torch.distributed with backend "rustdist"; the dumps are rustdist's either way
(``rustdist.flight_recorder``).
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any, Optional

import torch

from harness import ctx, init_env

#: Elements of every collective of the scenarios (the mismatch's culprit adds one).
N = 4
#: The timeout of init_process_group (the rendezvous), before the group's is shortened.
INIT_TIMEOUT_S = 60.0


def _dump_path() -> str:
    """This rank's dump file: TORCH_FR_DUMP_TEMP_FILE (set by ``setup``) and the rank."""
    return os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(ctx.rank)


def _group(name: Optional[str]) -> Any:
    """The group ``setup`` made under ``name`` (its group_desc); None is the default group."""
    return None if name is None else ctx.state["groups"][name]


def _failed(e: BaseException, started: float) -> dict[str, Any]:
    """What a rank saw of the failure: the exception, when, and whether its dump was written
    by the time the exception reached it."""
    return {"type": type(e).__name__, "error": str(e), "elapsed": time.monotonic() - started,
            "dumped": os.path.exists(_dump_path())}


def _expect_failure(what: str, call: Any) -> dict[str, Any]:
    """Calls ``call``, which must raise (RuntimeError: DistBackendError and the like)."""
    started = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        return _failed(e, started)
    raise AssertionError(f"rank {ctx.rank}: {what} returned although the job is broken")


def case_setup(dist: Any, rank: int, world: int, prefix: str, group_timeout: float,
               groups: dict[str, list[int]], warmup: dict[str, int],
               buffer_size: Optional[int] = None) -> None:
    """Points the automatic dumps at ``prefix`` (TORCH_FR_DUMP_TEMP_FILE), makes heartbeats
    come every 0.25 s (the statuses a timeout quotes are that fresh; 40 missed beats before a
    rank counts as silent, so that a loaded machine never fails a group that way first) and
    sets TORCH_FR_BUFFER_SIZE when given (read when the first group is made). Initialises
    with a long timeout (the rendezvous of many worlds at once takes seconds on a small
    machine), then sets the default group's to ``group_timeout`` s; makes ``groups``
    (group_desc -> members, on every rank) with that timeout and runs ``warmup[name]``
    all_reduces on each ("default": the default group). Returns once this rank's warm-up is
    done: the driver starts the scenario when every rank has."""
    os.environ.update(TORCH_FR_DUMP_TEMP_FILE=prefix, RUSTDIST_HEARTBEAT_INTERVAL="0.25",
                      RUSTDIST_HEARTBEAT_MISSES="40")
    if buffer_size is not None:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(buffer_size)
    init_env(dist, rank, world, INIT_TIMEOUT_S)
    td = timedelta(seconds=group_timeout)
    # The backend's setter: torch's _set_pg_timeout does not reach rustdist's backend.
    dist.group.WORLD._get_backend(torch.device("cpu"))._set_default_timeout(td)
    made = {name: dist.new_group(members, timeout=td, group_desc=name)
            for name, members in groups.items()}
    ctx.state["groups"] = made
    for name, count in warmup.items():
        members = list(range(world)) if name == "default" else groups[name]
        if rank not in members:
            continue
        for _ in range(count):
            t = torch.ones(N)
            dist.all_reduce(t, group=None if name == "default" else made[name])
            assert t.tolist() == [float(len(members))] * N, t


def case_skip(dist: Any, rank: int, world: int, culprit: int) -> dict[str, Any]:
    """``culprit`` skips the next all_reduce of the default group and enters a barrier of
    group "side" instead; every other rank enters the all_reduce. Everyone times out."""
    if rank == culprit:
        return _expect_failure("barrier on 'side'", lambda: dist.barrier(group=_group("side")))
    return _expect_failure("all_reduce", lambda: dist.all_reduce(torch.ones(N)))


def case_busy(dist: Any, rank: int, world: int, culprit: int, within: float) -> dict[str, Any]:
    """``culprit`` enters no collective (as a rank busy computing would) while the others
    enter the next all_reduce of the default group and time out. The culprit waits (at most
    ``within`` s) for its own dump, which the failure reaching it through the heartbeats must
    write, then finds its next all_reduce failing at once."""
    if rank != culprit:
        return _expect_failure("all_reduce", lambda: dist.all_reduce(torch.ones(N)))
    started = time.monotonic()
    while not os.path.exists(_dump_path()) and time.monotonic() - started < within:
        time.sleep(0.02)
    out = {"dumped": os.path.exists(_dump_path()), "waited": time.monotonic() - started}
    out["next"] = _expect_failure("the next all_reduce", lambda: dist.all_reduce(torch.ones(N)))
    return out


def case_order(dist: Any, rank: int, world: int, reversed_ranks: list[int]) -> dict[str, Any]:
    """All ranks call an all_reduce on group "first" and then on group "second", but
    ``reversed_ranks`` call them in the opposite order: each side waits for the other."""
    order = ["second", "first"] if rank in reversed_ranks else ["first", "second"]

    def both() -> None:
        for name in order:
            dist.all_reduce(torch.ones(N), group=_group(name))

    return _expect_failure("all_reduce on 'first' and 'second'", both)


def _entered(dist: Any, n: int = N) -> Any:
    """Issues an all_reduce of ``n`` elements on the default group (recorded from now on) and
    tells the driver, which releases the rank that breaks the job only when every other rank
    has said so; returns the Work to wait for."""
    work = dist.all_reduce(torch.ones(n), async_op=True)
    ctx.notify("entered")
    return work


def case_mismatch(dist: Any, rank: int, world: int, culprit: int) -> dict[str, Any]:
    """Every rank enters an all_reduce of the default group, ``culprit`` (released last) with
    one element more: rustdist detects it at once (no timeout)."""
    if rank == culprit:
        return _expect_failure("all_reduce of mismatched sizes",
                               lambda: dist.all_reduce(torch.ones(N + 1)))
    work = _entered(dist)
    return _expect_failure("all_reduce of mismatched sizes", work.wait)


def case_p2p(dist: Any, rank: int, world: int, sender: int, receiver: int) -> dict[str, Any]:
    """On group "pair" (``sender`` and ``receiver``): a send of N elements that the receiver
    receives, then a send of N + 2 that it never receives. Sends are eager (they complete once
    their bytes are handed to the link), so nothing hangs and no group fails: every rank
    takes its dump on demand (rustdist.flight_recorder.dump) once its part is done."""
    import rustdist.flight_recorder as fr

    pair = _group("pair")
    started = time.monotonic()
    if rank == sender:
        dist.send(torch.ones(N), dst=receiver, group=pair)
        dist.send(torch.ones(N + 2), dst=receiver, group=pair)
    elif rank == receiver:
        got = torch.zeros(N)
        dist.recv(got, src=sender, group=pair)
        assert got.tolist() == [1.0] * N, got
    path = fr.dump()
    return {"dump": path, "dumped": os.path.exists(path), "elapsed": time.monotonic() - started}


def case_abort(dist: Any, rank: int, world: int, aborter: int) -> dict[str, Any]:
    """The others enter the next all_reduce; then ``aborter`` (released last) aborts the
    default group (``group.WORLD.abort()``, which dumps) instead, and they fail on it."""
    if rank == aborter:
        dist.group.WORLD.abort()
        return {"dumped": os.path.exists(_dump_path())}
    work = _entered(dist)
    return _expect_failure("all_reduce", work.wait)


def case_wrap(dist: Any, rank: int, world: int, count: int) -> dict[str, Any]:
    """``count`` all_reduces on the default group, then a dump on demand; returns the dump's
    path and the recorder's capacity (TORCH_FR_BUFFER_SIZE, set by ``setup``)."""
    import rustdist.flight_recorder as fr

    for _ in range(count):
        dist.all_reduce(torch.ones(N))
    path = fr.dump()
    return {"dump": path, "dumped": os.path.exists(path), "capacity": fr.capacity()}


def case_blocked_under_signal(dist: Any, rank: int, world: int) -> None:
    """Installs ``dump_on_signal(SIGUSR1)`` over a handler that tells the driver "dumped"
    (``dump_on_signal`` calls the handler it replaces after dumping), says "ready", then
    blocks in an all_reduce that the other ranks enter only when the driver says
    (``case_join``)."""
    import rustdist.flight_recorder as fr

    signal.signal(signal.SIGUSR1, lambda signum, frame: ctx.notify("dumped"))
    fr.dump_on_signal(signal.SIGUSR1)
    ctx.notify("ready")
    t = torch.ones(N)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * N, t


def case_join(dist: Any, rank: int, world: int) -> None:
    """Enters the all_reduce that ``case_blocked_under_signal`` is blocked in."""
    t = torch.ones(N)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * N, t


def case_blocked_until_death(dist: Any, rank: int, world: int, keep: str) -> dict[str, Any]:
    """Enters an all_reduce and tells the driver (which then makes the victim exit); returns
    how it failed. The dump of that failure is moved into directory ``keep`` (the dump after
    the shrink would overwrite it)."""
    work = _entered(dist, 1 << 20)
    out = _expect_failure("all_reduce", work.wait)
    if out["dumped"]:
        os.replace(_dump_path(), os.path.join(keep, os.path.basename(_dump_path())))
    return out


def case_shrink_and_dump(dist: Any, rank: int, world: int, victim: int,
                         prefix: str) -> dict[str, Any]:
    """Shrinks the default group without ``victim``, runs an all_reduce on it and dumps on
    demand to ``prefix``."""
    import rustdist.flight_recorder as fr

    shrunk = dist.shrink_group([victim])
    t = torch.ones(N)
    dist.all_reduce(t)
    assert t.tolist() == [float(world - 1)] * N, t
    assert dist.get_world_size() == world - 1
    return {"dump": fr.dump(prefix), "ranks": dist.get_process_group_ranks(shrunk)}
