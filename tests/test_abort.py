"""ProcessGroup.abort() and _abort_process_group (torch's private API, which torch.distributed's
elastic and fault-tolerance code calls): an abort fails the pending collectives of the group on
every thread at once, in this rank and in its peers, and after aborting the world
init_process_group can be called again.

The cases (tests/abort_cases.py) run through both doors: ``import rustdist as dist``, and
torch.distributed with backend "rustdist" (RUSTDIST_TEST_DIST=torch
RUSTDIST_TEST_BACKEND=rustdist), where torch's ``group.abort()`` and
``torch.distributed.distributed_c10d._abort_process_group`` reach rustdist's
``ProcessGroup.abort()``. Each test has a world of its own (short_world): an aborted group is
broken on purpose.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Callable

import pytest

from harness import BACKEND, IS_TORCH, World, free_port

#: How fast every blocked call of the aborting rank must raise after abort() is called.
LOCAL_BOUND_S = 2.0
#: How fast the peers' blocked calls must raise after the aborting rank called abort().
PEER_BOUND_S = 5.0

#: Checked on torch 2.13: ProcessGroupGloo has no abort. ProcessGroup.abort() leaves a gloo
#: call blocked (until the group's timeout) and an aborted gloo group still reduces.
skip_gloo = pytest.mark.skipif(
    IS_TORCH and BACKEND == "gloo",
    reason="torch's gloo backend does not implement abort (ProcessGroup.abort() leaves its "
    "blocked calls blocked and the group usable); these tests run through torch.distributed "
    "with RUSTDIST_TEST_BACKEND=rustdist",
)


@skip_gloo
@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_abort_fails_blocked_calls_on_every_thread(short_world: Callable[..., World],
                                                   world: int) -> None:
    """Rank 0 has a thread blocked in a synchronous all_reduce and another in work.wait() of
    an async all_reduce (its peers never join either); its main thread calls
    group.WORLD.abort(): both raise DistBackendError saying the group was aborted within 2 s,
    and a later all_reduce fails at once. (The peers are not checked here: rank 0 sent its
    part of the aborted all_reduces, so a peer's next collective may fail on that first; see
    test_abort_fails_peers_blocked_calls.)"""
    w = short_world(world)
    w.run("warmup")
    out = w.run("abort_cases:abort_wakes_local_waiters", ranks=[0], timeout=30,
                bound=LOCAL_BOUND_S)[0]
    delays = {e["what"]: round(e["delay"], 4) for e in out["errors"]}
    print(f"world {world}: abort() returned in {out['abort_call_s'] * 1e6:.0f} us; blocked "
          f"calls raised after {delays} s")


@skip_gloo
@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_abort_fails_peers_blocked_calls(short_world: Callable[..., World], world: int) -> None:
    """The peers of rank 0 each have a thread in work.wait() of an async all_reduce and a
    thread blocked in a synchronous all_reduce, which rank 0 never joins; rank 0 calls
    group.WORLD.abort(): every one of those calls raises DistBackendError saying the group
    was aborted and naming rank 0, within 5 s of the abort."""
    w = short_world(world)
    w.run("warmup")
    peers = list(range(1, world))
    w.submit("abort_cases:blocked_until_peer_aborts", ranks=peers, aborter=0)
    w.wait_notes(peers, "abort_cases:blocked_until_peer_aborts")
    t_abort = w.run("abort_cases:abort_world_group", ranks=[0], alongside=True)[0]
    results = w.collect(peers, "abort_cases:blocked_until_peer_aborts", timeout=30)
    problems = []
    delays = {}
    for r, res in zip(peers, results):
        for e in res["errors"]:
            delay = e["t_end"] - t_abort
            delays[f"rank {r} {e['what']}"] = round(delay, 4)
            if delay > PEER_BOUND_S:
                problems.append(f"rank {r}: {e['what']} raised {delay:.3f} s after rank 0's "
                                f"abort (bound {PEER_BOUND_S} s): {e['msg']}")
    print(f"world {world}: peers' blocked calls raised after {delays} s")
    assert not problems, "\n".join(problems)


@skip_gloo
@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_abort_process_group_then_init_again(short_world: Callable[..., World], world: int) -> None:
    """_abort_process_group(subgroup) aborts and forgets that group alone; then
    _abort_process_group() (None: every group), with an all_reduce pending on a subgroup,
    fails it saying "aborted" and uninitialises the world, and init_process_group on a fresh
    port gives a world whose collectives work."""
    w = short_world(world, init=False)
    w.run("abort_cases:init_with_subgroups", port=free_port())
    w.run("abort_cases:abort_subgroup")
    w.run("abort_cases:abort_world_and_reinit", port=free_port())


@pytest.mark.skipif(IS_TORCH, reason="rustdist without torch (its own world state), in a "
                    "subprocess; the torch doors are the tests above")
@pytest.mark.timeout(60)
def test_abort_without_torch() -> None:
    """Without torch rustdist keeps the world itself: ProcessGroup.abort() fails a receive
    pending on another thread, _abort_process_group(subgroup) forgets that group alone, and
    _abort_process_group() uninitialises the world so that init_process_group works again."""
    code = textwrap.dedent("""
        import sys, threading, time
        sys.modules["torch"] = None  # `import torch` now raises ImportError
        import numpy as np
        import rustdist as dist
        from rustdist import distributed_c10d as c10d

        def expect(exc, word, fn, what):
            try:
                fn()
            except exc as e:
                assert word in str(e).lower(), f"{what}: {type(e).__name__} without {word!r}: {e}"
            else:
                raise AssertionError(f"{what}: no {exc.__name__} raised")

        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
        sub = dist.new_group([0])
        work = dist.irecv(np.zeros(4, dtype=np.float32), src=0, tag=7, group=sub)
        th = threading.Thread(target=lambda: expect(dist.DistBackendError, "abort", work.wait,
                                                    "wait() of a pending irecv"), daemon=True)
        th.start()
        th.join(0.2)
        assert th.is_alive(), "wait() of an irecv nobody sends to returned"
        t0 = time.monotonic()
        c10d._abort_process_group(sub)
        th.join(10)
        assert not th.is_alive(), "wait() still blocked 10 s after the abort"
        assert time.monotonic() - t0 < 2, f"wait() raised {time.monotonic() - t0:.2f} s after the abort"
        expect(ValueError, "invalid", lambda: c10d._abort_process_group(sub),
               "_abort_process_group of an aborted subgroup")
        assert dist.is_initialized(), "aborting a subgroup deinitialised the world"
        a = np.ones(3, dtype=np.float32)
        dist.all_reduce(a)
        assert a.tolist() == [1, 1, 1], a
        c10d._abort_process_group()
        assert not dist.is_initialized(), "is_initialized() after _abort_process_group()"
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(a)
        assert a.tolist() == [1, 1, 1], a
        dist.group.WORLD.abort()
        assert dist.is_initialized(), "ProcessGroup.abort() forgot the group (torch keeps it)"
        expect(dist.DistBackendError, "abort", lambda: dist.all_reduce(a),
               "all_reduce on the aborted world")
        dist.destroy_process_group()
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
