"""Changing a group's timeout after it is made (torch's ``_set_pg_timeout``, used to lengthen
timeouts around checkpoints, and the backend's ``_set_default_timeout`` it calls): the new
timeout governs the operations issued after the change, on every rank that sets it, and reads
back where torch reads it (``group._get_backend(device).options._timeout``).

Cases in tests/timeout_cases.py, through every door and setter (see its docstring). In
RUSTDIST_TEST_DIST=torch mode gloo validates them. One thing does not work through
torch.distributed with backend "rustdist": torch's own ``_set_pg_timeout`` (torch 2.13) only
reaches backends that are ``ProcessGroupGloo`` or ``ProcessGroupNCCL`` instances (and only
those among ``group._device_types``, which torch leaves empty for a backend whose creator
returns a ProcessGroup); for any other it warns and does nothing, which
test_torch_set_pg_timeout_on_rustdist_backend pins. The other setters (the backend's
``_set_default_timeout``, ``ProcessGroup.set_timeout``, ``options._timeout`` and
``rustdist._set_pg_timeout``) work there.
"""

from __future__ import annotations

from typing import Callable

import pytest

from harness import BACKEND, IS_TORCH, World

pytestmark = pytest.mark.timeout(90)

TORCH_RUSTDIST = IS_TORCH and BACKEND != "gloo"
GLOO = IS_TORCH and BACKEND == "gloo"

#: Why torch's _set_pg_timeout cannot reach rustdist's backend (checked on torch 2.13).
TORCH_REFUSES = (
    "torch's _set_pg_timeout only calls backends that are ProcessGroupGloo/ProcessGroupNCCL "
    "instances (it warns and does nothing for others); see "
    "test_torch_set_pg_timeout_on_rustdist_backend"
)
#: Checked on torch 2.13: gloo reports a value set through options._timeout but its
#: operations keep the old timeout (rustdist's options._timeout setter sets the timeout).
GLOO_OPTIONS = "gloo's options._timeout setter changes only the value it reports"

#: The timeout the broken worlds are made with: far longer than any bound asserted below.
LONG_S = 60.0
#: The timeout set after the fact, and how soon past it the missed collective must raise.
SHORT_S = 1.0
RAISE_BOUND_S = 10.0


def _hows(*, effective: bool,
          hows: tuple[str, ...] = ("set_pg_timeout", "rustdist", "backend", "set_timeout",
                                   "options")) -> list[object]:
    """The setters ``hows``, each skipped where it cannot work (``effective``: the test needs
    the new timeout to govern operations, not only to read back)."""
    marks = {
        "set_pg_timeout": pytest.mark.skipif(TORCH_RUSTDIST, reason=TORCH_REFUSES),
        "options": pytest.mark.skipif(effective and GLOO, reason=GLOO_OPTIONS),
    }
    return [pytest.param(h, marks=marks.get(h, ())) for h in hows]


@pytest.mark.parametrize("how", _hows(effective=False))
def test_timeout_reads_back(worlds: Callable[[int], World], how: str) -> None:
    """options._timeout reads the timeout the group was made with (30 s); set to 7.5 s on
    every rank it reads 7.5 s (the engine group's timeout too), the group still runs a
    collective, and set back it reads 30 s again."""
    worlds(2).run("timeout_cases:read_back_and_restore", how=how)


@pytest.mark.skipif(not TORCH_RUSTDIST, reason="torch.distributed with backend 'rustdist' only")
def test_torch_set_pg_timeout_on_rustdist_backend(worlds: Callable[[int], World]) -> None:
    """A limitation of torch, pinned: torch.distributed.distributed_c10d._set_pg_timeout on a
    rustdist group warns "Set timeout is now only supported for either nccl or gloo." and
    leaves the timeout unchanged. It keeps the backends it calls to those among
    ``group._device_types`` that are instances of ProcessGroupGloo or ProcessGroupNCCL (or of
    torchcomms' wrapper): rustdist's group is neither, and those pybind11 classes cannot be
    subclassed without building a real gloo/NCCL backend. Use the backend's
    ``_set_default_timeout``, ``group.set_timeout`` or ``rustdist._set_pg_timeout``.
    Should torch ever dispatch to any backend, this fails and the skips above can go."""
    worlds(2).run("timeout_cases:torch_refuses_rustdist")


@pytest.mark.parametrize("how", _hows(effective=True))
def test_shortened_timeout_fails_a_missed_collective(short_world: Callable[..., World],
                                                     how: str) -> None:
    """A group made with a 60 s timeout, set to 1 s on every rank; rank 1 never joins the
    next all_reduce: rank 0's raises within 1-10 s, a RuntimeError saying it timed out
    (DistBackendError on rustdist; gloo raises a plain RuntimeError)."""
    w = short_world(2, pg_timeout=LONG_S)
    w.run("warmup")
    out = w.run("timeout_cases:miss_a_collective", how=how, seconds=SHORT_S, absent=1,
                timeout=30)[0]
    _check_missed(out)


@pytest.mark.parametrize("how", _hows(effective=True, hows=("set_pg_timeout", "backend")))
def test_shortened_timeout_every_waiting_rank_raises(short_world: Callable[..., World],
                                                     how: str) -> None:
    """Three ranks, 60 s timeout set to 1 s on every rank; rank 2 never joins: ranks 0 and 1
    both raise within 1-10 s (one of them may learn it from the other's abort)."""
    w = short_world(3, pg_timeout=LONG_S)
    w.run("warmup")
    outs = w.run("timeout_cases:miss_a_collective", how=how, seconds=SHORT_S, absent=2,
                 timeout=30)[:2]
    for out in outs:
        assert SHORT_S * 0.8 <= out["elapsed"] < RAISE_BOUND_S, out
    assert any(o["timed_out"] for o in outs), outs
    if not GLOO:
        assert all(o["backend_error"] for o in outs), outs


def _check_missed(out: dict) -> None:
    assert SHORT_S * 0.8 <= out["elapsed"] < RAISE_BOUND_S, (
        f"raised after {out['elapsed']:.2f} s under a {SHORT_S} s timeout (made with "
        f"{LONG_S} s): {out}")
    assert out["timed_out"], out
    if not GLOO:
        assert out["type"] == "DistBackendError" and out["backend_error"], out


@pytest.mark.parametrize("how", _hows(effective=True))
def test_lengthened_timeout_lets_a_late_rank_join(short_world: Callable[..., World],
                                                  how: str) -> None:
    """A group made with a 2 s timeout, set to 30 s on every rank: rank 0's all_reduce stays
    pending 3 s (it would have failed at 2 s), then rank 1 joins and both succeed."""
    w = short_world(2, pg_timeout=2.0)
    w.run("warmup")
    w.run("timeout_cases:set_and_read_back", how=how, seconds=30.0)
    w.submit("timeout_cases:outlive_old_timeout", ranks=[0], hold=3.0)
    w.wait_notes([0], "outlive_old_timeout", timeout=30)
    w.run("timeout_cases:join_late", ranks=[1], alongside=True, timeout=30)
    w.collect([0], "outlive_old_timeout", timeout=30)


@pytest.mark.parametrize("how", ["set_pg_timeout", "backend"])
def test_subgroup_timeout_and_non_member(worlds: Callable[[int], World], how: str) -> None:
    """On a subgroup of ranks 0 and 1: a non-member's _set_pg_timeout raises ValueError
    "Invalid process group specified" (torch's and rustdist's); the members' change reads
    back on the subgroup only (made with the default 30 min), which still runs."""
    if how == "set_pg_timeout" and TORCH_RUSTDIST:
        how = "rustdist"  # torch's refuses rustdist's backend (see above); non-members still checked
    worlds(3).run("timeout_cases:subgroup_timeout", how=how)


def test_default_timeout_takes_a_timedelta(worlds: Callable[[int], World]) -> None:
    """_set_default_timeout(5) raises TypeError, as torch's binding does; nothing changes."""
    worlds(2).run("timeout_cases:setter_types")
