"""torch 2.14's reconfigure API, abort and collective hooks on rustdist groups (issue 48).

- torch's own fault-tolerance cases (``test_c10d_fault_tolerance.py``, world 3), one for one,
  on rustdist through the harness's door; in torch mode with backend gloo they run on gloo,
  which checks the cases themselves (CI runs that pass on the newest torch);
- collective hooks: each operation fires its pre- and post-hook once, worlds 1-4;
- abort hooks and ``get_error`` when a peer dies, then a reconfigure over the survivors;
- a replacement process (one that was in no group) joining two survivors after a kill -9 and
  after a SIGSTOP, on every path the suite runs on (shared memory, TCP, the test hosts, TLS);
- 50 shrink/grow cycles at world 4 leave threads, fds, shared memory and store keys as they
  were.

Cases in reconfigure_cases.py."""

from __future__ import annotations

import os
import re
import signal
import tempfile
from typing import Any, Callable

import pytest
import torch

from harness import BACKEND, HOSTS_SPEC, IS_TORCH, World, free_port, parse_hosts_spec

#: torch has the reconfigure API from 2.14 on: the torch door (and gloo) need it there.
TORCH_HAS_RECONFIGURE = hasattr(torch.distributed, "_reconfigure")

pytestmark = pytest.mark.timeout(180)
#: The tests that call torch's functions of the API (the torch door, or gloo).
needs_torch_api = pytest.mark.skipif(
    IS_TORCH and not TORCH_HAS_RECONFIGURE,
    reason=f"torch {torch.__version__} has no reconfigure API (2.14+): rustdist's own "
    "functions run it on the import-swap door")


def _not_on_gloo(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(IS_TORCH and BACKEND == "gloo", reason=f"gloo: {reason}")

#: torch's cases, in its file's order.
FT_CASES = ["reconfigure_basic", "reconfigure_then_all_reduce", "reconfigure_then_send_recv",
            "shrink_exclude_last_rank", "shrink_exclude_middle_rank",
            "reconfigure_scale_down_up", "reconfigure_single_to_all", "reconfigure_identity",
            "reconfigure_late_join", "reconfigure_merge_split", "reconfigure_after_abort",
            "reconfigure_after_timeout", "reconfigure_rejects_reused_uuid"]


def fits(world: int) -> bool:
    """Whether a world of `world` processes fits on the test hosts (RUSTDIST_TEST_HOSTS)."""
    hosts, per_host = parse_hosts_spec(HOSTS_SPEC)
    return -(-world // hosts) <= per_host


def _store_path() -> str:
    fd, path = tempfile.mkstemp(prefix="rustdist-reconfigure-")
    os.close(fd)
    os.unlink(path)  # the FileStore makes it
    return path


@needs_torch_api
@pytest.mark.parametrize("case", FT_CASES)
def test_torch_fault_tolerance_case(bare_world: Callable[[int], World], case: str) -> None:
    """torch's case `case` at world 3, as its gloo class runs it; torch runs
    ``test_reconfigure_after_timeout`` on nccl2 only (a timeout revokes the communicator),
    rustdist passes it too."""
    if case == "reconfigure_after_timeout" and IS_TORCH and BACKEND == "gloo":
        pytest.skip("torch's own skip: timeout-triggered revoke is specific to nccl2")
    bare_world(3).run(f"reconfigure_cases:ft_{case}", store_path=_store_path(), timeout=90)


def _names(seen: list[tuple[Any, ...]], kind: str) -> list[str]:
    return [s[1] for s in seen if s[0] == kind]


@needs_torch_api
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collective_hooks_fire_once_per_operation(bare_world: Callable[[int], World],
                                                  world: int) -> None:
    """Three all_reduces, an async one, a barrier, a broadcast, an all_gather_into_tensor, an
    isend and an irecv (world > 1), a functional all_reduce (torch.compile's): the pre-hooks
    see each once, in order, with torch's names, async flags, roots and tensor counts, and the
    post-hooks follow each with the same op_id; unregistered, they fire no more."""
    expected = ["ALLREDUCE"] * 4 + ["BARRIER", "BROADCAST", "ALLGATHER_BASE"]
    expected += (["SEND", "RECV"] if world > 1 else []) + ["ALLREDUCE"]
    for rank, got in enumerate(bare_world(world).run("reconfigure_cases:hook_counts",
                                                     store_path=_store_path())):
        seen = got["seen"]
        assert _names(seen, "pre") == expected, f"rank {rank}: {seen}"
        assert _names(seen, "post") == expected, f"rank {rank}: {seen}"
        pre = [s for s in seen if s[0] == "pre"]
        post = [s for s in seen if s[0] == "post"]
        assert [p[4] for p in pre] == [p[3] for p in post], f"rank {rank}: op ids {seen}"
        assert len(set(p[4] for p in pre)) == len(pre), f"rank {rank}: op ids repeat: {seen}"
        assert [p[2] for p in pre[:4]] == [False, False, False, True], f"rank {rank}: {pre}"
        assert pre[5][3] == world - 1, f"rank {rank}: broadcast root {pre[5]}"
        assert pre[0][5:] == (1, 0), f"rank {rank}: all_reduce's tensors {pre[0]}"
        assert pre[6][5:] == (1, 1), f"rank {rank}: all_gather's tensors {pre[6]}"
        assert got["after_unregister"] == 0, f"rank {rank}: hooks fired after unregistering"


@needs_torch_api
@_not_on_gloo("no abort hooks (supports_abort_hooks is False)")
def test_abort_hook_runs_once_when_a_peer_dies(short_world: Callable[..., World]) -> None:
    """World 3; rank 1 dies while the others are in an all_reduce: their abort hook runs once,
    ``get_error`` says REMOTE_ERROR, and the two reconfigure over their handles and reduce
    right."""
    w = short_world(3, init=False)
    case = "reconfigure_cases:abort_hook_on_peer_death"
    w.submit(case, store_path=_store_path(), victim=1)
    w.wait_notes([0, 1, 2], case)
    w.collect([1], case)
    os.kill(w.procs[1].pid, signal.SIGKILL)
    for rank, got in zip([0, 2], w.collect([0, 2], case, timeout=90)):
        assert got["calls"] == 1, f"rank {rank}: abort hook ran {got['calls']} times"
        assert got["error"].endswith("REMOTE_ERROR"), f"rank {rank}: {got['error']}"


#: Shrink/grow cycles of the leak test.
CYCLES = int(os.environ.get("RUSTDIST_TEST_CYCLES", "50"))


@needs_torch_api
@_not_on_gloo("its handles change at every reconfigure; the cycles reuse rustdist's, which "
              "stay the same")
def test_shrink_grow_cycles_leak_nothing(bare_world: Callable[[int], World]) -> None:
    """World 4: the last rank leaves and joins again, CYCLES times, an all_reduce checked each
    time: threads, fds, rustdist's shared memory and the store's keys are where they were
    after the first cycle."""
    got = bare_world(4).run("reconfigure_cases:shrink_grow_cycles", store_path=_store_path(),
                            cycles=CYCLES, timeout=600)
    for rank, (first, last) in enumerate(got):
        assert first == last, f"rank {rank}: after cycle 1 {first}, after {CYCLES} {last}"


#: How soon the survivors' blocked all_reduce must fail (the group's timeout is 30 s).
DETECTED_WITHIN_S = 20.0


@needs_torch_api
@_not_on_gloo("a collective whose peer died or froze may wait out the group's timeout "
              "(rustdist names the peer at once)")
@pytest.mark.parametrize("world,how", [(3, "kill"), (3, "stop"), (4, "kill"), (4, "stop"),
                                       (5, "kill"), (5, "stop"), (9, "kill")])
def test_replacement_process_joins_the_survivors(short_world: Callable[..., World], world: int,
                                                 how: str) -> None:
    """`world` processes: a group of world - 1 ranks, and a process in no group. The group
    loses its last rank to a kill -9 (or a SIGSTOP: it freezes, its sockets stay open) while
    the others are in an all_reduce it never joins; the survivors name it, and the other
    process inits alone on the job's store and joins them by reconfigure: the group has
    world - 1 ranks again, the newcomer last, and every operation is right."""
    if HOSTS_SPEC and not fits(world):
        pytest.skip(f"{world} processes do not fit on the test hosts {HOSTS_SPEC}")
    w = short_world(world, init=False)
    size = world - 1
    victim, spare = size - 1, size
    case = "reconfigure_cases:replacement"
    w.submit(case, port=free_port(), victim=victim)
    w.wait_notes(list(range(size)), case)
    os.kill(w.procs[victim].pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    members = [r for r in range(size) if r != victim] + [spare]
    for r, got in zip(members, w.collect(members, case, timeout=150)):
        assert (got["rank"], got["size"]) == (members.index(r), size), f"rank {r}: {got}"
        if r != spare:
            assert f"rank {victim}" in got["error"], f"rank {r}: {got['error']}"
            # A dead peer is named within milliseconds, a frozen one after about 5 s of missed
            # heartbeats: well before the group's timeout (30 s).
            assert got["waited"] < DETECTED_WITHIN_S, (
                f"rank {r}: the all_reduce failed {got['waited']:.1f} s after it began: "
                f"{got['error']}")


@needs_torch_api
@_not_on_gloo("no rustdist flight recorder, and its groups made before stay usable")
def test_groups_made_before_are_refused_and_the_recorder_names_the_uuid(
        bare_world: Callable[[int], World], tmp_path: Any) -> None:
    """World 3: a group made before the default group is reconfigured refuses work after it,
    saying it was reconfigured and to make it again; the flight recorder's dump has the
    re-formed group with its members and the reconfigure's uuid."""
    bare_world(3).run("reconfigure_cases:made_before", store_path=_store_path(),
                      dump_prefix=str(tmp_path / "fr_"))


@pytest.mark.parametrize("world", [1, 3])
def test_support_queries_answer_on_every_torch(worlds: Callable[[int], World],
                                               world: int) -> None:
    """torch 2.14's support queries and ``get_error`` answer on the default group and its
    backend object on every torch the suite runs (2.13's torch door too), gloo's answers on
    gloo: reconfigure yes, windows yes on every group (UNIFIED or SEPARATE; gloo: never), abort
    hooks yes (gloo: no), completion hooks no."""
    abort_hooks = not (IS_TORCH and BACKEND == "gloo")
    windows = abort_hooks
    for rank, got in enumerate(worlds(world).run("reconfigure_cases:support_queries")):
        if IS_TORCH and BACKEND == "gloo" and not TORCH_HAS_RECONFIGURE:
            assert all(str(v).startswith("raised") for v in got.values()), got
            continue
        for who in ("group", "backend"):
            assert got[f"{who}.supports_reconfigure"] is True, (rank, got)
            assert got[f"{who}.supports_window"] is windows, (rank, got)
            assert got[f"{who}.supports_abort_hooks"] is abort_hooks, (rank, got)
            assert got[f"{who}.supports_completion_hooks"] is False, (rank, got)
        assert got["get_error"] == "SUCCESS", (rank, got)


@needs_torch_api
@_not_on_gloo("no authentication of its links")
def test_a_handle_lets_no_stranger_in(short_world: Callable[..., World]) -> None:
    """A handle is data, not a credential: a process with another RUSTDIST_AUTH_KEY, named
    among the handles, makes the reconfigure fail on every rank instead of joining; the
    others then re-form without it."""
    got = short_world(3, init=False).run("reconfigure_cases:stranger",
                                         store_path=_store_path(), timeout=90)
    for rank, res in enumerate(got[:2]):
        assert "new rank 2" in res["error"] and "[2]" in res["error"], (rank, res["error"])
    assert "authenticat" in got[2]["error"], got[2]["error"]


@needs_torch_api
@_not_on_gloo("its reconfigure always goes through the store, which died with rank 0")
@pytest.mark.parametrize("world", [3, 4])
def test_survivors_reconfigure_without_the_store_when_its_rank_dies(
        short_world: Callable[..., World], world: int) -> None:
    """Rank 0, which serves the store, is killed while the others are in an all_reduce it never
    joins; the others
    re-form without it from the handles they kept, over their links (a failed group that only
    loses members shrinks), and reduce right."""
    w = short_world(world, init=False)
    case = "reconfigure_cases:store_rank_dies"
    w.submit(case, port=free_port())
    w.wait_notes(list(range(world)), case)
    os.kill(w.procs[0].pid, signal.SIGKILL)
    for r, got in zip(range(1, world), w.collect(list(range(1, world)), case, timeout=90)):
        assert "rank 0" in got["error"], f"rank {r}: {got['error']}"


@needs_torch_api
@_not_on_gloo("its error names no rank")
@pytest.mark.parametrize("absent", [0, 2])
def test_a_member_that_never_comes_is_named(bare_world: Callable[[int], World],
                                            absent: int) -> None:
    """World 3: a member named among the handles never calls reconfigure (the new rank 0, or
    another): every other fails within the timeout, naming it by its new rank."""
    got = bare_world(3).run("reconfigure_cases:absent_member", store_path=_store_path(),
                            absent=absent)
    for rank, res in enumerate(got):
        if rank != absent:
            missing = re.findall(r"new rank (\d) \([^)]*\) did not arrive", res["error"])
            assert missing == [str(absent)], (rank, res["error"])
