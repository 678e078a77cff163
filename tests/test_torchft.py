"""rustdist.torchft.ProcessGroupRustdist, torchft's reconfigurable process group on rustdist.

* torchft's own process-group tests (``torchft/process_group_test.py``: ``MultiPgBaseTest``,
  its per-collective cases and ``_run_with_resiliency``) on a world of 3 ranks, every
  collective of ``_ALL_COLLECTIVES``, those gloo lacks included.
* ``abort()`` from another thread fails the collectives blocked on every thread of the rank
  within 100 ms (and the peers' too), and ``errored()`` reports it. (The Works' ``wait()``
  returns when the operation failed: the error is on the Work, as torchft's Manager needs.)
* ``configure`` again (a new quorum): the previous group is aborted and released, the new one
  works; ``set_timeout`` reaches the live group; ``register`` makes torch's functional
  collectives work on it.
* A DDP run under torchft's Manager, Lighthouse on 127.0.0.1, two replica groups as processes
  (tests/torchft_ddp_prog.py): one is SIGKILLed mid-run and restarted, recovers from the
  other, and the run ends with the undisturbed run's loss.

Ranks are threads of the test process (as in torchft's tests) except in the DDP run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

torch = pytest.importorskip("torch")
tft = pytest.importorskip("torchft.process_group_test",
                          reason="torchft or parameterized missing (requirements-dev.txt)")
from parameterized import parameterized  # noqa: E402 - after the skip: torchft's test dep
from torch.distributed import ReduceOp, TCPStore  # noqa: E402
from torch.distributed import _functional_collectives as funcol  # noqa: E402
from torch.distributed.distributed_c10d import (  # noqa: E402
    AllToAllOptions,
    ReduceScatterOptions,
)
from torchft._torchft import LighthouseServer  # noqa: E402

from rustdist.bench import torchft as bench  # noqa: E402
from rustdist.torchft import ProcessGroupRustdist  # noqa: E402

#: The bound the issue sets between abort() and the blocked collectives' waits returning.
ABORT_BOUND_S = 0.1
PROG = Path(__file__).resolve().parent / "torchft_ddp_prog.py"


@pytest.mark.timeout(60)
class TestTorchftProcessGroupTests(tft.MultiPgBaseTest):
    """torchft's ``MultiPgBaseTest`` with :class:`ProcessGroupRustdist`: 3 ranks (threads of
    this process), every collective torchft tests, gloo's SKIP list empty.

    ``_run_with_resiliency``: each rank configures a fresh prefix, runs the collective, then
    the last rank shuts down and the others' next collective must fail (an error or outputs
    that are not the expected ones: torchft accepts either) and ``errored()``, if set, must
    say "aborted".

    torchft's CPU case of reduce_scatter checks nothing (it returns early on CPU, where gloo
    lacks it): ``test_configure_again_releases_previous_group`` checks it."""

    BACKEND = "rustdist"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str) -> ProcessGroupRustdist:
        return ProcessGroupRustdist(timeout=timedelta(seconds=10))

    @parameterized.expand(tft._ALL_COLLECTIVES)
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")

    @parameterized.expand(tft._ALL_COLLECTIVES)
    def test_collective_with_resiliency(self, collective: str) -> None:
        self._run_with_resiliency(collective, device="cpu")


@pytest.fixture
def store() -> TCPStore:
    """A TCPStore on 127.0.0.1 (torchft's replica-group store): ``configure`` gets
    ``127.0.0.1:PORT/prefix`` addresses on it."""
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _addr(store: TCPStore, prefix: str) -> str:
    return f"127.0.0.1:{store.port}/{prefix}"


def _on_ranks(world: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(rank)`` for every rank, each on a thread of its own; their results by rank."""
    with ThreadPoolExecutor(world) as ex:
        return list(ex.map(fn, range(world)))


def _configured(store: TCPStore, prefix: str, world: int,
                timeout: float = 20.0) -> list[ProcessGroupRustdist]:
    pgs = [ProcessGroupRustdist(timeout=timedelta(seconds=timeout)) for _ in range(world)]
    _on_ranks(world, lambda r: pgs[r].configure(_addr(store, prefix), "0", r, world))
    return pgs


def _shutdown(pgs: list[ProcessGroupRustdist]) -> None:
    for pg in pgs:
        pg.shutdown()


def _failure(work: Any) -> Optional[BaseException]:
    """What a Work of ProcessGroupRustdist failed with, once ``wait()`` returned (it does not
    raise: the error is on the Work and its future, as torchft's Manager reads it)."""
    work.wait()
    err = work.exception()
    if err is not None:
        with pytest.raises(RuntimeError):
            work.get_future().wait()
    return err


def _ok(work: Any) -> None:
    err = _failure(work)
    if err is not None:
        raise err


@pytest.mark.timeout(60)
def test_abort_interrupts_blocked_collectives_on_every_thread(store: TCPStore) -> None:
    """World 3. Ranks 0 and 1 have two threads each blocked in ``work.wait()`` of an
    allreduce that rank 2 never joins; another thread calls rank 0's ``abort()``: both of
    rank 0's waits return within 100 ms with the Work failed with DistBackendError saying
    the group was aborted, rank 1's fail too (rank 0 tells its peers), and ``errored()``
    reports it on both ranks."""
    world = 3
    pgs = _configured(store, "abort", world, timeout=30)
    ready = threading.Barrier(5)
    failed: dict[tuple[int, int], tuple[float, Optional[BaseException]]] = {}

    def blocked(rank: int, i: int) -> None:
        work = pgs[rank].allreduce([torch.ones(4)], ReduceOp.SUM)
        ready.wait()
        work.wait()
        when = time.monotonic()
        failed[(rank, i)] = (when, _failure(work))

    threads = [threading.Thread(target=blocked, args=(r, i)) for r in (0, 1) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        ready.wait()
        for t in threads:
            t.join(0.05)
        assert not failed and all(t.is_alive() for t in threads), "not blocked before abort"
        start = time.monotonic()
        aborter = threading.Thread(target=pgs[0].abort)
        aborter.start()
        for t in [aborter, *threads]:
            t.join(10)
        delays = {k: when - start for k, (when, _) in failed.items()}
        print(f"blocked waits returned after {delays} s")
        assert set(failed) == {(0, 0), (0, 1), (1, 0), (1, 1)}, failed
        for _, err in failed.values():
            assert isinstance(err, torch.distributed.DistBackendError), repr(err)
            assert "aborted" in str(err), err
        assert max(delays[(0, 0)], delays[(0, 1)]) < ABORT_BOUND_S, delays
        for rank in (0, 1):
            err = pgs[rank].errored()
            assert isinstance(err, RuntimeError) and "aborted" in str(err), repr(err)
        with pytest.raises(AssertionError, match="process group not initialized"):
            pgs[0].allreduce([torch.ones(1)], ReduceOp.SUM)
    finally:
        _shutdown(pgs)


def _check_collectives(pg: ProcessGroupRustdist, rank: int, world: int) -> None:
    """allreduce, reduce_scatter, reduce_scatter_tensor_coalesced and alltoall_base (gloo
    lacks the last three) on ``pg``, checked element-wise."""
    t = torch.arange(4, dtype=torch.float32) + rank
    _ok(pg.allreduce([t], ReduceOp.SUM))
    want = torch.arange(4, dtype=torch.float32) * world + sum(range(world))
    assert torch.equal(t, want), (t, want)
    # rank r gets sum over ranks s of (block r of rank s) = (10 r + s) summed over s
    opts = ReduceScatterOptions()
    opts.reduceOp = ReduceOp.SUM
    blocks = [torch.full((3,), 10.0 * r + rank) for r in range(world)]
    out = torch.empty(3)
    _ok(pg.reduce_scatter([out], [blocks], opts))
    assert torch.equal(out, torch.full((3,), 10.0 * rank * world + sum(range(world)))), out
    outs = [torch.empty(2), torch.empty(2)]
    ins = [torch.stack(blocks)[:, :2].contiguous(), -torch.stack(blocks)[:, :2].contiguous()]
    _ok(pg.reduce_scatter_tensor_coalesced(outs, ins, opts))
    assert torch.equal(outs[0], out[:2]) and torch.equal(outs[1], -out[:2]), outs
    # alltoall: rank r sends 100 r + d to rank d
    send = torch.tensor([100.0 * rank + d for d in range(world)])
    recv = torch.empty(world)
    _ok(pg.alltoall_base(recv, send, [1] * world, [1] * world, AllToAllOptions()))
    assert torch.equal(recv, torch.tensor([100.0 * s + rank for s in range(world)])), recv


@pytest.mark.timeout(60)
def test_configure_again_releases_previous_group(store: TCPStore) -> None:
    """World 3. A second ``configure`` (quorum 2, a fresh prefix) aborts and releases the
    first incarnation (its group refuses work), and the new group runs every collective gloo
    lacks, checked element-wise. ``set_timeout`` reaches the live group: rank 0's allreduce
    that no peer joins times out after 0.5 s."""
    world = 3
    pgs = _configured(store, "quorum1", world)
    try:
        _on_ranks(world, lambda r: _check_collectives(pgs[r], r, world))
        first = [pg.parent for pg in pgs]
        _on_ranks(world, lambda r: pgs[r].configure(_addr(store, "quorum2"), "0", r, world,
                                                     quorum_id=2))
        for old in first:
            assert old._pg.error() is not None
            with pytest.raises(torch.distributed.DistBackendError, match="aborted"):
                old.allreduce([torch.ones(1)], ReduceOp.SUM).wait()
        names = {pg.parent.group_name for pg in pgs}
        assert len(names) == 1 and names != {old.group_name for old in first}, names
        assert all(pg.errored() is None for pg in pgs)
        _on_ranks(world, lambda r: _check_collectives(pgs[r], r, world))

        pgs[0].set_timeout(timedelta(seconds=0.5))
        assert pgs[0].parent.options._timeout == timedelta(seconds=0.5)
        start = time.monotonic()
        err = _failure(pgs[0].allreduce([torch.ones(1)], ReduceOp.SUM))
        assert 0.4 < time.monotonic() - start < 5
        assert isinstance(err, torch.distributed.DistBackendError), repr(err)
        assert "timed out" in str(err).lower(), err
        assert "aborted" in str(pgs[0].errored())
    finally:
        _shutdown(pgs)


@pytest.fixture
def torch_world() -> Iterator[None]:
    """torch's default group (gloo, world 1), which torchft's ``register`` builds on."""
    dist = torch.distributed
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_register_makes_functional_collectives_work(store: TCPStore, torch_world: None) -> None:
    """World 2. ``register(name)`` puts the group in torch's registry (torch resolves its
    name to it), and torch's functional collectives (all_reduce, all_gather_single,
    reduce_scatter_single, all_to_all_single) run on it with the right values."""
    from torch._C._distributed_c10d import _resolve_process_group

    world = 2
    pgs = [ProcessGroupRustdist(timeout=timedelta(seconds=20)) for _ in range(world)]
    for r, pg in enumerate(pgs):
        assert pg.register(f"test_torchft_{r}") is pg
        assert _resolve_process_group(pg.group_name) is pg

    def rank_main(rank: int) -> None:
        pgs[rank].configure(_addr(store, "funcol"), "0", rank, world)
        pg = pgs[rank]
        t = torch.arange(4, dtype=torch.float32) * (rank + 1)
        got = funcol.all_reduce(t, "sum", pg).wait()
        assert torch.equal(got, torch.arange(4, dtype=torch.float32) * 3), got
        got = funcol.all_gather_single(t, 0, pg).wait()
        assert torch.equal(got, torch.cat([torch.arange(4.0), torch.arange(4.0) * 2])), got
        got = funcol.reduce_scatter_single(torch.arange(4.0) + rank, "sum", 0, pg).wait()
        assert torch.equal(got, (torch.arange(4.0) * 2 + 1)[2 * rank:2 * rank + 2]), got
        got = funcol.all_to_all_single(torch.tensor([10.0 * rank, 10.0 * rank + 1]), None,
                                       None, pg).wait()
        assert torch.equal(got, torch.tensor([float(rank), 10.0 + rank])), got

    try:
        _on_ranks(world, rank_main)
    finally:
        for pg in pgs:
            pg.unregister()
        _shutdown(pgs)


class _Replica:
    """A replica group of tests/torchft_ddp_prog.py, its JSON lines read as they come;
    with ``hang_at`` it hangs in that step and is SIGKILLed once it says so."""

    def __init__(self, lighthouse: str, replica_id: int, steps: int, log: Path,
                 hang_at: Optional[int] = None) -> None:
        self.log = log
        self.records: list[dict[str, Any]] = []
        args = [lighthouse, str(replica_id), str(steps)]
        args += [] if hang_at is None else [str(hang_at)]
        with open(log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(PROG), *args],
                                         stdout=subprocess.PIPE, stderr=err, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            self.records.append(rec)
            if rec.get("hung"):
                self.proc.send_signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        return rc

    def stderr_tail(self) -> str:
        return self.log.read_text()[-3000:]

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The records of its attempts at steps."""
        return [r for r in self.records if "committed" in r]

    @property
    def done(self) -> dict[str, Any]:
        last = self.records[-1] if self.records else {}
        assert last.get("done"), f"replica did not finish:\n{self.stderr_tail()}"
        return last


def _run_ddp(tmp: Path, tag: str, steps: int, hang_at: Optional[int]) -> list[_Replica]:
    """Two replica groups under one Lighthouse on 127.0.0.1; with ``hang_at``, replica 1
    hangs in that step, is SIGKILLed and started again. Returns [replica 0, replica 1] plus
    the restarted replica 1 when there is one."""
    # min_replicas 2: a quorum needs both replica groups, so the survivor waits for the
    # restarted replica and recovery can heal it. Short heartbeat and join timeouts: the
    # killed replica's last heartbeat must not hold up the quorum of the restarted one.
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000,
                                  heartbeat_timeout_ms=2000)
    addr = f"http://127.0.0.1:{lighthouse.address().rsplit(':', 1)[1]}"
    replicas = [_Replica(addr, r, steps, tmp / f"{tag}-{r}.log", hang_at if r == 1 else None)
                for r in (0, 1)]
    try:
        if hang_at is not None:
            assert replicas[1].wait(60) == -signal.SIGKILL, replicas[1].stderr_tail()
            replicas.append(_Replica(addr, 1, steps, tmp / f"{tag}-1-restarted.log"))
        for rep in replicas:
            if rep.proc.poll() != -signal.SIGKILL:
                assert rep.wait(60) == 0, rep.stderr_tail()
        return replicas
    finally:
        for rep in replicas:
            if rep.proc.poll() is None:
                rep.proc.kill()
                rep.proc.wait()
        lighthouse.shutdown()


@pytest.mark.timeout(110)
def test_ddp_under_manager_recovers_killed_replica(tmp_path: Path) -> None:
    """30 steps of torchft DDP (Manager, DistributedDataParallel, OptimizerWrapper) on two
    replica groups joined by ProcessGroupRustdist. Undisturbed: every step commits. Then
    again with replica 1 hanging in step 10 and SIGKILLed there, then restarted: the
    survivor's step-10 allreduce fails (the peer died) and that attempt does not commit; the
    restarted replica recovers the survivor's state (it starts at the survivor's step, not
    0); both finish all 30 steps, every step from the rejoin on commits on both with 2
    participants, and the final loss is within 5% of the undisturbed run's."""
    steps, hang_at = 30, 10
    calm = _run_ddp(tmp_path, "undisturbed", steps, None)
    for rep in calm:
        assert rep.done["step"] == steps
        assert all(r["committed"] for r in rep.steps), rep.steps
    baseline = calm[0].done["final_loss"]
    assert calm[1].done["final_loss"] == baseline

    survivor, killed, restarted = _run_ddp(tmp_path, "killed", steps, hang_at)
    assert killed.records[-1] == {"step": hang_at, "hung": True}
    for rep in (survivor, restarted):
        assert rep.done["step"] == steps, rep.steps
    failed = [r for r in survivor.steps if not r["committed"]]
    assert failed and all(r["step"] == hang_at and r["error"] for r in failed), failed
    rejoined, quorum = restarted.steps[0]["step"], restarted.steps[0]["quorum"]
    assert rejoined == hang_at, "the restarted replica did not recover the survivor's state"
    after = [r for r in survivor.steps if r["quorum"] >= quorum] + restarted.steps
    assert len(after) == 2 * (steps - hang_at), after
    assert all(r["committed"] and r["participants"] == 2 for r in after), after
    final = survivor.done["final_loss"]
    print(f"survivor's failed attempt: {failed}; the restarted replica rejoined at step "
          f"{rejoined}; final loss {final:.6f} vs undisturbed {baseline:.6f}")
    assert restarted.done["final_loss"] == final
    assert abs(final - baseline) <= 0.05 * baseline


@pytest.mark.timeout(60)
def test_reconfigure_benchmark_runs(tmp_path: Path) -> None:
    """``python -m rustdist.bench.torchft`` on a small run (world 2, 2 changes, rustdist and
    gloo; BabyGloo's subprocesses take seconds each): a table row and a JSON row per
    backend, every change timed."""
    out = tmp_path / "bench.json"
    assert bench.main(["--world", "2", "--changes", "2", "--json", str(out), "--backends",
                       "ProcessGroupRustdist", "ProcessGroupGloo"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["world"]) for r in rows] == [("ProcessGroupRustdist", 2),
                                                           ("ProcessGroupGloo", 2)]
    for r in rows:
        assert len(r["changes_s"]) == 2 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
