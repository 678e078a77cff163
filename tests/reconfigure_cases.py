"""Cases for tests/test_reconfigure.py: torch 2.14's reconfigure API (``_supports_reconfigure``,
``_get_reconfigure_handle``, ``_reconfigure``), ``abort``, ``get_error`` and the abort and
collective hooks, on a fresh group per case.

The ``ft_*`` cases are the cases of torch's ``test/distributed/test_c10d_fault_tolerance.py``
(its ``AbstractFaultToleranceTest``, world 3), one for one, with the same scenario and the same
assertions; torch ships that file in no wheel, so they are written here again. In torch mode
with backend gloo they run on gloo (which validates them), else on rustdist through the
harness's front door. Each case makes its group on a FileStore of its own (``store_path``,
given by the driver) and destroys it at the end."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch

from dist_cases import check
from harness import BACKEND, ctx

TIMEOUT = timedelta(seconds=30)


def _error_type() -> Any:
    """torch's ErrorType (torch 2.14+), else rustdist's copy of it (same names)."""
    try:
        from torch._C._distributed_c10d import ErrorType
    except ImportError:
        from rustdist._errors import ErrorType
    return ErrorType


class _Case:
    """torch's test's fixture: the store, the default group and its backend object."""

    def __init__(self, dist: Any, rank: int, world: int, store_path: str) -> None:
        self.dist, self.rank, self.world_size = dist, rank, world
        self.store = dist.FileStore(store_path, world)
        dist.init_process_group(BACKEND, world_size=world, rank=rank, store=self.store,
                                timeout=TIMEOUT, enable_reconfigure=True)
        self.pg = dist.group.WORLD
        self.backend = self.pg._get_backend(torch.device("cpu"))
        assert dist._supports_reconfigure() is True
        assert self.backend.supports_reconfigure is True

    def collect_handles(self, prefix: str) -> list[str]:
        handle = self.dist._get_reconfigure_handle()
        self.store.set(f"{prefix}_{self.rank}", handle)
        return [self.store.get(f"{prefix}_{r}").decode() for r in range(self.world_size)]

    def store_barrier(self, prefix: str) -> None:
        self.store.set(f"{prefix}_{self.rank}", "1")
        for r in range(self.world_size):
            self.store.get(f"{prefix}_{r}")

    def reconfigure(self, uuid: int, handles: Any) -> None:
        self.dist._reconfigure(uuid, handles, timeout=TIMEOUT).wait()

    def reconfigured(self, name: str, uuid: int) -> list[str]:
        self.reconfigure(uuid, self.collect_handles(f"{name}_init"))
        assert self.dist.get_world_size() == self.world_size
        assert self.dist.get_rank() == self.rank
        return self.collect_handles(f"{name}_post")

    def all_reduce_sum(self, expected: float) -> None:
        t = torch.full((4,), self.dist.get_rank() + 1.0)
        self.dist.all_reduce(t)
        check(t, torch.full((4,), expected), "all_reduce on the reconfigured group")


def _run(dist: Any, rank: int, world: int, store_path: str,
         body: Callable[[_Case], Any]) -> Any:
    """``body`` on a fresh reconfigurable default group, destroyed afterwards (torch's
    tearDown)."""
    case = _Case(dist, rank, world, store_path)
    try:
        return body(case)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _total(n: int) -> float:
    return float(sum(range(1, n + 1)))


def case_made_before(dist: Any, rank: int, world: int, store_path: str,
                     dump_prefix: str) -> None:
    """A group made before the default group is reconfigured refuses work afterwards, saying
    so; the flight recorder's dump has the re-formed group with its members and the uuid."""
    import pickle

    from rustdist import flight_recorder

    def body(c: _Case) -> None:
        sub = dist.new_group([0, 1])
        c.reconfigured("made_before", 7)
        if rank in (0, 1):
            try:
                dist.all_reduce(torch.ones(2), group=sub)
            except RuntimeError as e:
                assert "reconfigured" in str(e) and "new_group" in str(e), e
            else:
                raise AssertionError("a group made before the reconfigure still ran")
        with open(flight_recorder.dump(dump_prefix), "rb") as f:
            groups = pickle.load(f)["pg_config"].values()
        assert any("reconfigure uuid 7" in g["desc"] and g["ranks"] == str(list(range(world)))
                   for g in groups), list(groups)

    _run(dist, rank, world, store_path, body)


def case_support_queries(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """What the default group (the shared world's) answers to torch 2.14's support queries
    and error state, on any torch: each query's answer, or the error it raised."""
    pg = dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    got: dict[str, Any] = {}
    for name in ("supports_reconfigure", "supports_window", "supports_abort_hooks",
                 "supports_completion_hooks"):
        for who, obj in (("group", pg), ("backend", backend)):
            try:
                got[f"{who}.{name}"] = getattr(obj, name)
            except Exception as e:  # noqa: BLE001 - the answer is what the test checks
                got[f"{who}.{name}"] = f"raised {type(e).__name__}: {e}"
    try:
        got["get_error"] = str(backend.get_error()).rsplit(".", 1)[-1]
    except Exception as e:  # noqa: BLE001
        got["get_error"] = f"raised {type(e).__name__}: {e}"
    return got


def case_ft_reconfigure_basic(dist: Any, rank: int, world: int, store_path: str) -> None:
    _run(dist, rank, world, store_path, lambda c: c.reconfigured("ft_basic", 100))


def case_ft_reconfigure_then_all_reduce(dist: Any, rank: int, world: int,
                                        store_path: str) -> None:
    def body(c: _Case) -> None:
        c.reconfigured("ft_all_reduce", 200)
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_then_send_recv(dist: Any, rank: int, world: int,
                                       store_path: str) -> None:
    def body(c: _Case) -> None:
        c.reconfigured("ft_send_recv", 300)
        me = dist.get_rank()
        to, frm = (me + 1) % world, (me - 1 + world) % world
        out, into = torch.full((4,), me + 1.0), torch.zeros(4)
        if me % 2 == 0:
            works = [c.backend.send([out], to, 0), c.backend.recv([into], frm, 0)]
        else:
            works = [c.backend.recv([into], frm, 0), c.backend.send([out], to, 0)]
        for w in works:
            w.wait()
        check(into, torch.full((4,), frm + 1.0), "recv after the reconfigure")

    _run(dist, rank, world, store_path, body)


def case_ft_shrink_exclude_last_rank(dist: Any, rank: int, world: int,
                                     store_path: str) -> None:
    def body(c: _Case) -> None:
        handles = c.reconfigured("ft_shrink_last", 400)
        last = world - 1
        if rank != last:
            c.reconfigure(401, handles[:last])
            assert (dist.get_world_size(), dist.get_rank()) == (world - 1, rank)
            c.all_reduce_sum(_total(world - 1))
            t = torch.full((4,), 42.0) if dist.get_rank() == 0 else torch.zeros(4)
            dist.broadcast(t, group_src=0)
            check(t, torch.full((4,), 42.0), "broadcast on the shrunk group")
        c.store_barrier("ft_shrink_last_done")

    _run(dist, rank, world, store_path, body)


def case_ft_shrink_exclude_middle_rank(dist: Any, rank: int, world: int,
                                       store_path: str) -> None:
    def body(c: _Case) -> None:
        handles = c.reconfigured("ft_shrink_middle", 500)
        middle = world // 2
        if rank != middle:
            c.reconfigure(501, [h for r, h in enumerate(handles) if r != middle])
            assert dist.get_world_size() == world - 1
            assert dist.get_rank() == (rank if rank < middle else rank - 1)
            c.all_reduce_sum(_total(world - 1))
        c.store_barrier("ft_shrink_middle_done")

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_scale_down_up(dist: Any, rank: int, world: int,
                                      store_path: str) -> None:
    def body(c: _Case) -> None:
        c.reconfigure(600 + rank, [dist._get_reconfigure_handle()])
        assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
        c.reconfigure(603, c.collect_handles("ft_scale_down_up"))
        assert (dist.get_world_size(), dist.get_rank()) == (world, rank)
        if BACKEND == "gloo":
            # gloo's reconfigure returns while its peers may still be connecting: a rank that
            # re-forms again at once closes sockets a peer is handshaking on ("Connection
            # closed by peer", about 1 run in 20, most under load). gloo gets a barrier here;
            # rustdist (whose reconfigure ends in one) runs torch's case as written.
            c.store_barrier("ft_scale_down_up_formed")
        c.reconfigure(604 + rank, [dist._get_reconfigure_handle()])
        assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
        c.store_barrier("ft_scale_down_up_done")

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_single_to_all(dist: Any, rank: int, world: int,
                                      store_path: str) -> None:
    def body(c: _Case) -> None:
        c.reconfigure(700 + rank, [dist._get_reconfigure_handle()])
        c.reconfigure(703, c.collect_handles("ft_single_to_all"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_identity(dist: Any, rank: int, world: int, store_path: str) -> None:
    def body(c: _Case) -> None:
        c.reconfigured("ft_identity", 800)
        c.reconfigure(801, c.collect_handles("ft_identity_again"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_late_join(dist: Any, rank: int, world: int, store_path: str) -> None:
    def body(c: _Case) -> None:
        handles = c.collect_handles("ft_late_join_initial")
        first = world // 2
        if rank < first:
            c.reconfigure(900, handles[:first])
        c.reconfigure(901, c.collect_handles("ft_late_join_all"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_merge_split(dist: Any, rank: int, world: int, store_path: str) -> None:
    def body(c: _Case) -> None:
        handles = c.collect_handles("ft_merge_split_initial")
        split = world // 2
        if rank < split:
            c.reconfigure(1000, handles[:split])
        else:
            c.reconfigure(1001, handles[split:])
        c.reconfigure(1002, c.collect_handles("ft_merge_split_all"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_after_abort(dist: Any, rank: int, world: int, store_path: str) -> None:
    def body(c: _Case) -> None:
        ErrorType = _error_type()  # noqa: N806 - torch's name
        c.reconfigured("ft_abort", 1200)
        c.backend.abort()
        assert c.backend.get_error() == ErrorType.SUCCESS, c.backend.get_error()
        c.reconfigure(1201, c.collect_handles("ft_abort_recover"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_after_timeout(dist: Any, rank: int, world: int,
                                      store_path: str) -> None:
    """torch runs this one on nccl2 only (a timeout revokes the communicator); rustdist does
    it too: the timed-out group calls its abort hooks, reports TIMEOUT, refuses collectives
    with "timed out", and a reconfigure recovers it."""
    def body(c: _Case) -> None:
        ErrorType = _error_type()  # noqa: N806 - torch's name
        c.reconfigured("ft_timeout", 1300)
        c.all_reduce_sum(_total(world))
        c.backend.set_timeout(timedelta(seconds=2))
        revoked = threading.Event()
        c.backend.register_abort_hook(0, revoked.set)
        if rank != 0:
            work = dist.all_reduce(torch.ones(4), async_op=True)
            assert revoked.wait(10), "the group was not revoked after the operation timed out"
            assert c.backend.get_error() == ErrorType.TIMEOUT, c.backend.get_error()
            try:
                dist.all_reduce(torch.ones(4), async_op=True)
            except RuntimeError as e:
                assert "timed out" in str(e).lower(), e
            else:
                raise AssertionError("an all_reduce on the timed-out group was accepted")
            del work
        c.backend.unregister_abort_hook(0)
        c.backend.set_timeout(timedelta(seconds=30))
        c.store_barrier("ft_timeout_observed")
        c.reconfigure(1301, c.collect_handles("ft_timeout_recover"))
        c.all_reduce_sum(_total(world))

    _run(dist, rank, world, store_path, body)


def case_ft_reconfigure_rejects_reused_uuid(dist: Any, rank: int, world: int,
                                            store_path: str) -> None:
    def body(c: _Case) -> None:
        uuid = 1100 + rank
        c.reconfigure(uuid, [dist._get_reconfigure_handle()])
        try:
            c.reconfigure(uuid, [dist._get_reconfigure_handle()])
        except RuntimeError as e:
            assert "already used" in str(e), e
        else:
            raise AssertionError(f"uuid {uuid} was accepted twice")

    _run(dist, rank, world, store_path, body)


# ---------------------------------------------------------------------------------------------
# What torch's file leaves out


def case_hook_counts(dist: Any, rank: int, world: int, store_path: str) -> dict[str, Any]:
    """Pre- and post-hooks on the default group around three all_reduces, an async one, a
    barrier, a broadcast, an all_gather_into_tensor, (world > 1) an isend/irecv ring and a
    functional all_reduce (the C++ call torch.compile makes): each fires once
    per operation, pre and post paired by op_id; after unregistering, none fires. Returns
    what the hooks saw (names, async flags, roots, tensor counts)."""
    seen: list[tuple[Any, ...]] = []

    def body(c: _Case) -> dict[str, Any]:
        if hasattr(dist, "_reconfigure"):
            c.reconfigure(1, c.collect_handles("hooks"))  # gloo runs nothing before it
        pg = dist.group.WORLD
        pg.register_pre_hook(7, lambda a: seen.append(
            ("pre", a.name.name, a.async_op, a.root,
             a.op_id, len(a.input_tensors), len(a.output_tensors))))
        pg.register_post_hook(7, lambda a: seen.append(
            ("post", a.name.name, a.async_op, a.op_id)))
        t = torch.ones(8)
        for _ in range(3):
            dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.barrier()
        dist.broadcast(t, group_src=world - 1)
        out = torch.empty(8 * world)
        dist.all_gather_into_tensor(out, t)
        if world > 1:  # gloo cannot send to itself
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            box = torch.empty(8)
            for w in [dist.isend(t, dst=nxt), dist.irecv(box, src=prv)]:
                w.wait()
        # A functional collective, as torch.compile issues it (c10d's C++ calls the group).
        import torch.distributed._functional_collectives as funcol

        funcol.wait_tensor(funcol.all_reduce(t, "sum", pg))
        pg.unregister_pre_hook(7)
        pg.unregister_post_hook(7)
        before = len(seen)
        dist.all_reduce(t)
        return {"seen": seen, "after_unregister": len(seen) - before}

    return _run(dist, rank, world, store_path, body)


def case_abort_hook_on_peer_death(dist: Any, rank: int, world: int, store_path: str,
                                  victim: int) -> dict[str, Any]:
    """Survivors register an abort hook, block in an all_reduce and see `victim` die: the hook
    runs once, ``get_error`` says REMOTE_ERROR, and a reconfigure over the survivors' handles
    recovers the group. Returns the hook's call count and the error type."""
    def body(c: _Case) -> dict[str, Any]:
        c.reconfigured("death", 1)
        calls: list[float] = []
        fired = threading.Event()

        def hook() -> None:
            calls.append(time.monotonic())
            fired.set()

        c.backend.register_abort_hook(3, hook)
        handles = c.collect_handles("death_handles")
        ctx.notify("entering")
        try:
            dist.all_reduce(torch.ones(1 << 20))
        except RuntimeError:
            pass
        else:
            raise AssertionError("the all_reduce returned although a rank died")
        assert fired.wait(10), "the abort hook did not run"
        error = str(c.backend.get_error())
        survivors = [h for r, h in enumerate(handles) if r != victim]
        c.reconfigure(2, survivors)
        c.all_reduce_sum(_total(world - 1))
        return {"calls": len(calls), "error": error}

    case = _Case(dist, rank, world, store_path)
    if rank == victim:
        case.reconfigured("death", 1)
        case.collect_handles("death_handles")
        ctx.notify("entering")
        ctx.state["case"] = case
        return {}
    try:
        return body(case)
    finally:
        dist.destroy_process_group()


def _resources(dist: Any, store: Any) -> dict[str, int]:
    """What a leak would raise: this process's threads and fds, rustdist's shared memory
    segments, the store's keys."""
    shm = [n for n in os.listdir("/dev/shm") if "rustdist" in n]
    return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")),
            "shm": len(shm), "keys": store.num_keys()}


def case_shrink_grow_cycles(dist: Any, rank: int, world: int, store_path: str,
                            cycles: int) -> list[dict[str, int]]:
    """`cycles` times: the last rank leaves (the others reconfigure without it), then joins
    again (all reconfigure), each time an all_reduce checked on the new group. Returns the
    resources after the first cycle and after the last (a barrier before each count)."""
    def body(c: _Case) -> list[dict[str, int]]:
        handles = c.collect_handles("cycles")
        counts = []
        for i in range(cycles):
            if rank < world - 1:
                c.reconfigure(10 + 2 * i, handles[:-1])
                c.all_reduce_sum(_total(world - 1))
            c.reconfigure(11 + 2 * i, handles)
            c.all_reduce_sum(_total(world))
            if i in (0, cycles - 1):
                dist.barrier()
                counts.append(_resources(dist, c.store))
                if os.environ.get("RUSTDIST_DEBUG_KEYS") and rank == 0:
                    print(i, sorted(c.store.list_keys()), flush=True)
                dist.barrier()
        return counts

    return _run(dist, rank, world, store_path, body)


def case_replacement(dist: Any, rank: int, world: int, port: int,
                     victim: int) -> dict[str, Any]:
    """Ranks 0..world-2 form a group on a TCPStore (rank 0 serves it) and block in an
    all_reduce that `victim` never joins; the driver kills or freezes it. The last rank is a process that was in
    no group: once the survivors ask for it, it inits alone (world 1, on the job's store) and
    the survivors and it reconfigure over their handles into a group of the old size, the
    newcomer last. Every kind of operation is then checked on it. Returns the survivors'
    error and each member's new rank and size."""
    from shrink_cases import _check_group

    size, spare = world - 1, world - 1
    survivors = [r for r in range(size) if r != victim]
    store = dist.TCPStore(os.environ["MASTER_ADDR"], port, None, rank == 0, timeout=TIMEOUT,
                          wait_for_workers=False)
    ctx.state["store"] = store  # rank 0's serves the job until the world ends
    error, waited = "", 0.0
    if rank == spare:
        store.wait(["replace/needed"], 3 * TIMEOUT)  # past the survivors' group timeout
        dist.init_process_group(BACKEND, world_size=1, rank=0, store=store, timeout=TIMEOUT,
                                enable_reconfigure=True)
    else:
        dist.init_process_group(BACKEND, world_size=size, rank=rank, store=store,
                                timeout=TIMEOUT, enable_reconfigure=True)
        dist.all_reduce(torch.ones(4))
        ctx.notify("entering")
        if rank == victim:  # never joins: the all_reduce cannot end before it dies
            threading.Event().wait()
        t_enter = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1 << 20))
        except RuntimeError as e:
            error = str(e)
        else:
            raise AssertionError(f"rank {rank}: the all_reduce returned although rank "
                                 f"{victim} died")
        waited = time.monotonic() - t_enter
        store.set("replace/needed", "1")
    store.set(f"replace/{rank}", dist._get_reconfigure_handle())
    handles = [store.get(f"replace/{r}").decode() for r in [*survivors, spare]]
    dist._reconfigure(1, handles, timeout=TIMEOUT).wait()
    try:
        got = {"error": error, "waited": waited, "rank": dist.get_rank(),
               "size": dist.get_world_size()}
        _check_group(dist)
        objects = [None] * size
        dist.all_gather_object(objects, {"from": rank})
        assert [o["from"] for o in objects] == [*survivors, spare], objects
        if dist.get_rank() == 0:
            _check_status(f"{os.environ['MASTER_ADDR']}:{port}", size)
        dist.barrier()
        return got
    finally:
        dist.destroy_process_group()


def _check_status(address: str, size: int) -> None:
    """``python -m rustdist.status`` (its ``query``) sees the re-formed world: `size` ranks,
    each answering, each in a group of ranks 0..size-1 that says reconfigure uuid 1 made it."""
    from rustdist import status

    ranks = status.query(address, timeout=5.0)
    assert len(ranks) == size, ranks
    for r in ranks:
        assert r["alive"], r
        assert any(g["ranks"] == list(range(size)) and "reconfigure uuid 1" in g["desc"]
                   for g in r["groups"]), r["groups"]


def case_stranger(dist: Any, rank: int, world: int, store_path: str) -> dict[str, Any]:
    """The ranks share one store, each in a group of its own; rank 2 has another
    RUSTDIST_AUTH_KEY than the others. Named in the others' handles it gets in nowhere: the
    reconfigure over all three fails on every rank; ranks 0 and 1 then re-form without it.
    Returns each rank's error from the refused reconfigure."""
    os.environ["RUSTDIST_AUTH_KEY"] = "stranger-key" if rank == 2 else \
        os.environ.get("RUSTDIST_AUTH_KEY", "the-job-key")
    store = dist.FileStore(store_path, world)
    dist.init_process_group(BACKEND, world_size=1, rank=0, store=store, timeout=TIMEOUT,
                            enable_reconfigure=True)
    try:
        store.set(f"stranger/{rank}", dist._get_reconfigure_handle())
        handles = [store.get(f"stranger/{r}").decode() for r in range(world)]
        try:
            dist._reconfigure(1, handles, timeout=timedelta(seconds=10)).wait()
        except RuntimeError as e:
            error = str(e)
        else:
            raise AssertionError(f"rank {rank}: a process with another key was let in")
        if rank < 2:
            dist._reconfigure(2, handles[:2], timeout=TIMEOUT).wait()
            t = torch.full((4,), rank + 1.0)
            dist.all_reduce(t)
            check(t, torch.full((4,), 3.0), "all_reduce without the stranger")
        return {"error": error}
    finally:
        dist.destroy_process_group()


def case_store_rank_dies(dist: Any, rank: int, world: int, port: int) -> dict[str, Any]:
    """Rank 0 serves the TCPStore; the group is re-formed once (so it knows its members) and
    every rank keeps the handles. Rank 0 is killed while the others are in an all_reduce it
    never joins: the
    survivors reconfigure over their handles without it, with no store (a failed group that
    only loses members shrinks over its links), and reduce right. Returns the error."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], port, None, rank == 0, timeout=TIMEOUT,
                          wait_for_workers=False)
    ctx.state["store"] = store
    dist.init_process_group(BACKEND, world_size=world, rank=rank, store=store, timeout=TIMEOUT,
                            enable_reconfigure=True)
    try:
        store.set(f"h/{rank}", dist._get_reconfigure_handle())
        handles = [store.get(f"h/{r}").decode() for r in range(world)]
        dist._reconfigure(1, handles, timeout=TIMEOUT).wait()
        ctx.notify("entering")
        if rank == 0:  # never joins: the all_reduce cannot end before it dies
            threading.Event().wait()
        try:
            dist.all_reduce(torch.ones(1 << 20))
        except RuntimeError as e:
            error = str(e)
        else:
            raise AssertionError(f"rank {rank}: the all_reduce returned although rank 0 died")
        dist._reconfigure(2, handles[1:], timeout=TIMEOUT).wait()
        assert (dist.get_rank(), dist.get_world_size()) == (rank - 1, world - 1)
        t = torch.full((4,), float(rank))
        dist.all_reduce(t)
        check(t, torch.full((4,), float(sum(range(1, world)))), "all_reduce without rank 0")
        return {"error": error}
    finally:
        dist.destroy_process_group()


def case_absent_member(dist: Any, rank: int, world: int, store_path: str,
                       absent: int) -> dict[str, Any]:
    """Every rank publishes its handle; all but `absent` reconfigure over all of them, with a
    timeout of 3 s: each fails within it, naming the absent rank. Returns the error."""
    def body(c: _Case) -> dict[str, Any]:
        handles = c.collect_handles("absent")
        if rank == absent:
            c.store_barrier("absent_done")
            return {}
        try:
            dist._reconfigure(5, handles, timeout=timedelta(seconds=3)).wait()
        except RuntimeError as e:
            error = str(e)
        else:
            raise AssertionError(f"rank {rank}: reconfigured although rank {absent} never came")
        c.store_barrier("absent_done")
        return {"error": error}

    return _run(dist, rank, world, store_path, body)
