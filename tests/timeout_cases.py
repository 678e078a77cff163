"""Cases of changing a group's timeout after it is made, run inside the rank processes.

The driver names them ``"timeout_cases:<name>"`` (see harness.find_case). ``how`` says which
setter a case uses, each one torch's tests or code use:

* ``set_pg_timeout``: ``dist.distributed_c10d._set_pg_timeout(td, group)`` (torch's, or
  rustdist's own in rustdist mode);
* ``rustdist``: ``rustdist._set_pg_timeout(td, group)`` (the import-swap door's function; on a
  gloo group it passes the call on to torch's);
* ``backend``: ``group._get_backend(torch.device("cpu"))._set_default_timeout(td)`` (what
  torch's ``_set_pg_timeout`` calls; torch's NCCL tests call it directly);
* ``set_timeout``: ``group.set_timeout(td)`` (torch's ``ProcessGroup.set_timeout``);
* ``options``: ``group._get_backend(torch.device("cpu")).options._timeout = td``.

The timeout is read back as torch's tests read it: ``_get_backend(cpu).options._timeout``.
"""

from __future__ import annotations

import re
import time
import warnings
from datetime import timedelta
from typing import Any, Optional

import torch

from dist_cases import check, sanity
from harness import ctx

HOWS = ("set_pg_timeout", "rustdist", "backend", "set_timeout", "options")
#: How the message of an operation that outlived its timeout reads (torch's
#: test_barrier_timeout_full_group matches this; gloo says "Timed out waiting 1000ms").
TIMED_OUT = r"(Timed out|timeout)"

CPU = torch.device("cpu")


def _group(dist: Any, group: Optional[Any]) -> Any:
    return dist.group.WORLD if group is None else group


def set_timeout(dist: Any, how: str, seconds: float, group: Optional[Any] = None) -> None:
    """Sets the timeout of ``group`` (default: the default group) the way ``how`` says."""
    td = timedelta(seconds=seconds)
    pg = _group(dist, group)
    if how == "set_pg_timeout":
        dist.distributed_c10d._set_pg_timeout(td, group)
    elif how == "rustdist":
        import rustdist

        rustdist._set_pg_timeout(td, group)
    elif how == "backend":
        pg._get_backend(CPU)._set_default_timeout(td)
    elif how == "set_timeout":
        pg.set_timeout(td)
    elif how == "options":
        pg._get_backend(CPU).options._timeout = td
    else:
        raise ValueError(f"unknown setter {how!r}")


def read_timeout(dist: Any, group: Optional[Any] = None) -> float:
    """The group's timeout in seconds, as torch's tests read it."""
    return _group(dist, group)._get_backend(CPU).options._timeout.total_seconds()


def _engine_timeout(dist: Any, group: Optional[Any] = None) -> Optional[float]:
    """The timeout rustdist's engine group reports, None on a gloo group."""
    core = getattr(_group(dist, group), "_pg", None)
    return None if core is None else core.timeout


def case_set_and_read_back(dist: Any, rank: int, world: int, how: str, seconds: float) -> None:
    """Sets the default group's timeout to ``seconds`` with ``how``; reads it back through
    ``options._timeout`` (and the engine group's ``timeout`` on rustdist); the group still
    runs a collective."""
    set_timeout(dist, how, seconds)
    got = read_timeout(dist)
    assert got == seconds, f"{how}: options._timeout reads {got} s after setting {seconds} s"
    engine = _engine_timeout(dist)
    assert engine in (None, seconds), f"{how}: the engine group says {engine} s, not {seconds} s"
    sanity(dist, world)


def case_read_back_and_restore(dist: Any, rank: int, world: int, how: str) -> None:
    """On a shared world: the timeout reads as made (ctx.pg_timeout); set to 7.5 s with
    ``how`` it reads 7.5 s and a collective still runs; set back, it reads as made."""
    made = ctx.pg_timeout
    got = read_timeout(dist)
    assert got == made, f"options._timeout reads {got} s in a group made with {made} s"
    try:
        case_set_and_read_back(dist, rank, world, how, 7.5)
    finally:
        set_timeout(dist, how, made)
    assert read_timeout(dist) == made, f"{how}: not restored to {made} s"


def case_torch_refuses_rustdist(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """torch.distributed with backend "rustdist": torch's ``_set_pg_timeout`` warns that it
    supports only gloo and nccl, and leaves the group's timeout as it was (its isinstance
    check on ProcessGroupGloo/ProcessGroupNCCL; see test_timeouts.py)."""
    before = read_timeout(dist)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=before + 5))
    messages = [str(w.message) for w in caught]
    assert any("only supported for either nccl or gloo" in m for m in messages), messages
    after = read_timeout(dist)
    assert after == before, f"torch's _set_pg_timeout changed the timeout to {after} s"
    return {"warnings": messages}


def case_miss_a_collective(dist: Any, rank: int, world: int, how: str, seconds: float,
                           absent: int) -> Optional[dict[str, Any]]:
    """Every rank sets the timeout to ``seconds`` (the group was made with a much longer
    one); every rank but ``absent`` calls all_reduce, which ``absent`` never joins. Returns,
    on the others, how long the call took to raise and what it raised."""
    set_timeout(dist, how, seconds)
    assert read_timeout(dist) == seconds
    if rank == absent:
        return None
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(16))
    except RuntimeError as e:
        return {"elapsed": time.monotonic() - t0, "type": type(e).__name__,
                "backend_error": isinstance(e, dist.DistBackendError),
                "timed_out": bool(re.search(TIMED_OUT, str(e))), "msg": str(e)[:500]}
    raise AssertionError(f"all_reduce returned although rank {absent} never joined")


def case_outlive_old_timeout(dist: Any, rank: int, world: int, hold: float) -> dict[str, Any]:
    """Issues an all_reduce its peer has not joined yet and watches it stay pending for
    ``hold`` seconds (longer than the timeout the group was made with, shorter than the one
    set since), tells the driver, then waits for it: it succeeds once the peer joins."""
    t = torch.full((8,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < hold:
        if work.is_completed():
            work.wait()  # raises the error that ended it early
            raise AssertionError("the all_reduce completed although its peer has not joined")
        time.sleep(0.05)  # watching the Work, not waiting for anything
    ctx.notify(time.monotonic() - t0)
    work.wait()
    check(t, torch.full((8,), float(world * (world + 1) // 2)), "late all_reduce")
    return {"elapsed": time.monotonic() - t0}


def case_join_late(dist: Any, rank: int, world: int) -> None:
    """Joins the all_reduce the other ranks issued long ago (case_outlive_old_timeout)."""
    t = torch.full((8,), float(rank + 1))
    dist.all_reduce(t)
    check(t, torch.full((8,), float(world * (world + 1) // 2)), "late all_reduce")


def case_subgroup_timeout(dist: Any, rank: int, world: int, how: str) -> None:
    """A subgroup of ranks 0 and 1: on rank 2 (not a member) ``_set_pg_timeout`` on it raises
    ValueError "Invalid process group specified", torch's and rustdist's alike; on the members
    setting its timeout leaves the default group's as it was, and the subgroup still runs."""
    g = dist.new_group([0, 1])
    if rank not in (0, 1):
        import rustdist

        for fn in (dist.distributed_c10d._set_pg_timeout, rustdist._set_pg_timeout):
            try:
                fn(timedelta(seconds=5), g)
            except ValueError as e:
                assert str(e) == "Invalid process group specified", str(e)
            else:
                raise AssertionError(f"{fn.__module__}._set_pg_timeout on a non-member returned")
        return
    made = read_timeout(dist, g)
    assert made == 30 * 60, f"the subgroup was made with {made} s, not the default 30 min"
    set_timeout(dist, how, 5.0, g)
    assert read_timeout(dist, g) == 5.0
    assert _engine_timeout(dist, g) in (None, 5.0)
    assert read_timeout(dist) == ctx.pg_timeout, "the default group's timeout changed"
    t = torch.ones(4)
    dist.all_reduce(t, group=g)
    check(t, torch.full((4,), 2.0), "subgroup all_reduce")


def case_setter_types(dist: Any, rank: int, world: int) -> None:
    """``_set_default_timeout`` takes a timedelta: a number of seconds raises TypeError (as
    torch's pybind11 binding does); the timeout is unchanged."""
    before = read_timeout(dist)
    backend = dist.group.WORLD._get_backend(CPU)
    try:
        backend._set_default_timeout(5)
    except TypeError:
        pass
    else:
        raise AssertionError("_set_default_timeout(5) accepted an int")
    assert read_timeout(dist) == before
