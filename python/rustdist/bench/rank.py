"""One rank of a benchmark world: ``python -m rustdist.bench.rank RUN_FOLDER``.

Started by ``launch.py`` (the rank comes from RANK, or from Open MPI's OMPI_COMM_WORLD_RANK
under mpirun). It joins rustdist's world, sets up the sides of its mode, checks and times every
case as the package docstring describes, and rank 0 reports the rows as events.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as td

import rustdist as rd

from .common import DTYPE_BYTES, Config, bandwidths, bound_core, layout
from .launch import CONFIG_FILE, Emitter
from .sides import Call, Side, check, mpi_side, torch_side

# Collective timeout of every group: a hung peer becomes an error instead of a stuck bench.
OP_TIMEOUT = timedelta(seconds=120)


def reduce_max(values: np.ndarray) -> np.ndarray:
    """Element-wise maximum of `values` (float64) over the ranks (rustdist takes numpy)."""
    out = np.ascontiguousarray(values, dtype=np.float64)
    rd.all_reduce(out, op=rd.ReduceOp.MAX)
    return out


def _no_sync() -> None:
    pass


class Timer:
    """Times calls the same way for every side: `barrier` before each round, `sync` (the
    device's, or nothing on CPU) around it."""

    def __init__(self, cfg: Config, barrier: Callable[[], Any],
                 sync: Callable[[], Any] = _no_sync) -> None:
        self.cfg = cfg
        self.barrier = barrier
        self.sync = sync

    def iterations(self, calls: list[Call], nbytes: int) -> list[int]:
        """N for each of `calls`, the calls per round: enough for a round of about
        ``round_seconds`` from a few warm calls (the slowest rank's estimate, so every rank
        agrees). Each side gets its own N: the round's first call absorbs the barrier's exit
        skew, and a fast side held to the N of a slow one (gloo) would report mostly that."""
        first = 10 if nbytes < (1 << 20) else 3 if nbytes < (16 << 20) else 1
        est = self._estimate(calls, [first] * len(calls))
        # Again over about 5 ms: a few calls of a fast collective on oversubscribed cores
        # say more about the scheduler than about the call.
        est = self._estimate(calls, [int(min(500, max(1, 0.005 / t))) for t in est])
        return [int(min(self.cfg.max_iters, max(1.0, self.cfg.round_seconds / t)))
                for t in est]

    def _estimate(self, calls: list[Call], counts: list[int]) -> list[float]:
        """Seconds per call of each of `calls` over ``counts[i]`` calls after one more, the
        slowest rank's."""
        est = np.zeros(len(calls))
        for i, call in enumerate(calls):
            call()
            self.sync()
            t0 = time.perf_counter()
            for _ in range(counts[i]):
                call()
            self.sync()
            est[i] = (time.perf_counter() - t0) / counts[i]
        return reduce_max(est).tolist()

    def rounds(self, calls: list[Call], iters: list[int]) -> np.ndarray:
        """Seconds per call of each of `calls` (``iters[i]`` calls of call i a round) per
        round, [call, round], the slowest rank's. The order alternates between rounds
        (forward, then reversed), so order effects cancel out."""
        per_call = np.zeros((len(calls), self.cfg.rounds))
        for r in range(self.cfg.rounds):
            for i in range(len(calls)) if r % 2 == 0 else reversed(range(len(calls))):
                self.sync()
                self.barrier()
                t0 = time.perf_counter()
                for _ in range(iters[i]):
                    calls[i]()
                self.sync()
                per_call[i, r] = (time.perf_counter() - t0) / iters[i]
        return reduce_max(per_call)


def bench_case(sides: list[Side], timer: Timer, rank: int, op: str,
               size: int) -> Optional[dict[str, Any]]:
    """Checks and times one (op, size) on every side (in the first side's dtype); returns the
    row on rank 0."""
    world, dtype = timer.cfg.world, sides[0].dtype
    lay = layout(op, size, world, DTYPE_BYTES[dtype])
    calls, oks = [], []
    # Every side works on the same buffers (each checks on them, then times on zeros), so
    # that where their pages lie cannot favour one side.
    shared_in, shared_out = sides[0].alloc(lay.n_in), sides[0].alloc(lay.n_out)
    for side in sides:
        inp, out = side.view(shared_in), side.view(shared_out)
        call = side.make_call(op, inp, out)
        oks.append(check(call, lay, rank, inp, out))
        calls.append(call)
    # A side is right when it is right on every rank.
    wrong = reduce_max(np.array([0.0 if ok else 1.0 for ok in oks]))
    timed = [i for i in range(len(sides)) if not wrong[i]]
    iters = timer.iterations([calls[i] for i in timed], lay.nbytes) if timed else []
    per_call = timer.rounds([calls[i] for i in timed], iters) if timed else None
    if rank != 0:
        return None
    peers: dict[str, dict[str, Any]] = {s.name: {"correct": False} for s in sides}
    for k, i in enumerate(timed):
        rounds_us = [t * 1e6 for t in per_call[k].tolist()]
        us = statistics.median(rounds_us)
        algbw, busbw = bandwidths(op, lay.nbytes, world, us * 1e-6)
        peers[sides[i].name] = {"correct": True, "us": us, "algbw_gbps": algbw,
                                "busbw_gbps": busbw, "rounds_us": rounds_us,
                                "iters": iters[k]}
    base = peers[sides[0].name].get("us")
    speedup = {f"vs_{name}": p["us"] / base for name, p in peers.items()
               if name != sides[0].name and base and "us" in p}
    return {"world": world, "op": op, "dtype": dtype, "bytes": lay.nbytes, "peers": peers,
            "speedup": speedup}


def front_door_case(timer: Timer, rank: int, gloo: Any) -> Optional[dict[str, Any]]:
    """8-byte all_reduce: rustdist's own API vs torch.distributed on rustdist's default group
    (the same group: torch's default group is rustdist's), synchronous; then asynchronous
    calls waited for at once (``async_op=True``, and a functional collective, which DTensor
    and torch.compile use), the same through torch on the ``gloo`` group."""
    import torch.distributed._functional_collectives as funcol

    own, door, other = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    world = td.group.WORLD
    calls = [lambda: rd.all_reduce(own), lambda: td.all_reduce(door),
             lambda: rd.all_reduce(own, async_op=True).wait(),
             lambda: td.all_reduce(door, async_op=True).wait(),
             lambda: funcol.all_reduce(door, "sum", world).wait(),
             lambda: td.all_reduce(other, group=gloo, async_op=True).wait(),
             lambda: funcol.all_reduce(other, "sum", gloo).wait()]
    for call in calls:
        for _ in range(50):
            call()
    n = 2000 if timer.cfg.rounds > 5 else 500
    per_call = timer.rounds(calls, iters=[n] * 5 + [n // 10] * 2)  # gloo: ~0.1-1 ms a call
    if rank != 0:
        return None
    own_us, door_us, own_async, door_async, funcol_us, gloo_async, gloo_funcol = (
        statistics.median(t * 1e6 for t in per_call[i].tolist()) for i in range(len(calls)))
    return {"world": timer.cfg.world, "bytes": 8, "rustdist_us": own_us,
            "torch_front_door_us": door_us, "overhead_us": door_us - own_us,
            "async": {"rustdist_us": own_async, "torch_front_door_us": door_async,
                      "functional_us": funcol_us, "gloo_us": gloo_async,
                      "gloo_functional_us": gloo_funcol}}


def _run_cases(sides: list[Side], timer: Timer, rank: int, out: Emitter) -> None:
    for op in timer.cfg.ops:
        for size in timer.cfg.sizes:
            if rank == 0:
                out.emit("case", op=op, bytes=size, dtype=sides[0].dtype)
            row = bench_case(sides, timer, rank, op, size)
            if row is not None:
                out.emit("row", **row)


def _compare(cfg: Config, rank: int, out: Emitter) -> None:
    """rustdist vs gloo (and MPI) on CPU tensors, then the front door."""
    gloo = td.new_group(backend="gloo", timeout=OP_TIMEOUT)
    sides = [torch_side("rustdist", rd), torch_side("gloo", td, group=gloo)]
    barriers: list[Callable[[], Any]] = [rd.barrier, lambda: td.barrier(group=gloo)]
    if cfg.mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        sides.append(mpi_side(comm, MPI))
        barriers.append(comm.Barrier)

    def barrier() -> None:
        for b in barriers:
            b()

    timer = Timer(cfg, barrier)
    _run_cases(sides, timer, rank, out)
    if rank == 0:
        out.emit("case", op="front_door", bytes=8)
    row = front_door_case(timer, rank, gloo)
    if row is not None:
        out.emit("front_door", **row)


def _deepspeed(cfg: Config, rank: int, out: Emitter) -> None:
    """all_reduce of each dtype: rustdist through the torch door and the import swap vs
    DeepSpeed's shared-memory op and gloo, on the same buffers."""
    from .deepspeed_shm import rank_sides

    gloo = td.new_group(backend="gloo", timeout=OP_TIMEOUT)

    def barrier() -> None:
        rd.barrier()
        td.barrier(group=gloo)

    timer = Timer(cfg, barrier)
    with rank_sides(cfg, rank, gloo) as sides_of:
        for dtype in cfg.dtypes:
            _run_cases(sides_of(dtype), timer, rank, out)


def _cuda(cfg: Config, rank: int, out: Emitter) -> None:
    """rustdist's NCCL path vs torch's ProcessGroupNCCL on CUDA tensors."""
    from .gpu import cuda_sides

    sides, barrier, sync = cuda_sides(rank, OP_TIMEOUT)
    _run_cases(sides, Timer(cfg, barrier, sync), rank, out)


def main(argv: Optional[list[str]] = None) -> None:
    """Runs this rank of the world whose run folder is the only argument."""
    run_dir = (sys.argv[1:] if argv is None else argv)[0]
    with open(os.path.join(run_dir, CONFIG_FILE), encoding="utf-8") as f:
        cfg = Config.from_json(f.read())
    rank = int(os.environ["OMPI_COMM_WORLD_RANK" if cfg.mpi else "RANK"])
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's deprecations
    torch.set_num_threads(1)
    core = bound_core(rank, cfg.world, list(os.sched_getaffinity(0))) if cfg.bind else None
    if core is not None:  # before MPI and the groups start threads, which inherit it
        os.sched_setaffinity(0, {core})
    if cfg.mpi:
        from mpi4py import MPI  # noqa: F401 - MPI_Init before the other worlds start threads
    rd.init_process_group("nccl" if cfg.mode == "cuda" else "rustdist",
                          init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}", rank=rank,
                          world_size=cfg.world, timeout=OP_TIMEOUT)
    out = Emitter(run_dir, rank)
    try:
        if cfg.mode == "soak":
            from .soak import soak_rank

            soak_rank(cfg, rank, out)
        elif cfg.mode == "recovery":
            from .recovery import recovery_rank

            recovery_rank(cfg, rank, out)
        elif cfg.mode == "cuda":
            _cuda(cfg, rank, out)
        elif cfg.mode == "deepspeed":
            _deepspeed(cfg, rank, out)
        else:
            _compare(cfg, rank, out)
    finally:
        out.close()
    rd.destroy_process_group()


if __name__ == "__main__":
    main()
