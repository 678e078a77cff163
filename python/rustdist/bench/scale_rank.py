"""One rank of ``--scale``: joins a world at the common instant and measures what a world of
this size costs the rank (``scale.py`` has the method).

Started by ``scale.py`` as ``python -c BOOT scale_rank.py RUN_FOLDER`` (run as a file, not as
``rustdist.bench.scale_rank``: importing the package ``rustdist.bench`` imports torch), with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment. This module imports only
the standard library and numpy at the top; a rustdist rank then imports rustdist with torch
made unimportable (and checks that torch never loaded), a gloo rank imports torch.

The rank appends JSON lines ``{"event": ..., "rank": r, ...}`` to ``rank<r>.jsonl`` in the
run folder (what ``launch.Follower`` reads); its stdout and stderr go to ``rank<r>.err``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import numpy as np

#: The file the launcher writes ``{"start_at": wall-clock seconds}`` into once every rank is
#: ready (written elsewhere and renamed, so a rank never reads half of it).
START_FILE = "start.json"
CONFIG_FILE = "scale.json"
#: How often a ready rank looks for the start file (seconds).
START_POLL_S = 0.05
PR_SET_PDEATHSIG = 1


def hide_torch() -> None:
    """Makes ``import torch`` fail from here on, as where torch is not installed, with the
    finder of ``rustdist._torchless``, loaded as a file: importing it as part of the package
    would import the package, and so torch, first."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "_rustdist_torchless", os.path.join(package, "_torchless.py"))
    assert spec is not None and spec.loader is not None
    torchless = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torchless)
    torchless.hide()


class Out:
    """This rank's event lines (``rank<r>.jsonl``), one JSON object per line, flushed: the
    lines of ``launch.Emitter``, which a rank without torch cannot import (importing the
    package ``rustdist.bench`` imports torch)."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.rank = rank
        self._f = open(os.path.join(run_dir, f"rank{rank}.jsonl"), "a", encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> None:
        """Appends ``{"event": event, "rank": rank, **fields}``."""
        self._f.write(json.dumps({"event": event, "rank": self.rank, **fields}) + "\n")
        self._f.flush()

    def __enter__(self) -> "Out":
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


class Side:
    """The calls a rank makes on its side (rustdist on numpy arrays, or torch's gloo on torch
    tensors): buffers, all_reduce (sum or max), barrier, and the world's setup."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout = timedelta(seconds=timeout_s)
        if name == "rustdist":
            hide_torch()
            import rustdist as dist

            self.dist: Any = dist
            self.torch: Any = None
        else:
            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            self.dist, self.torch = dist, torch

    def init(self, rank: int, world: int) -> None:
        """Joins the world through env:// (MASTER_ADDR, MASTER_PORT)."""
        backend = "rustdist" if self.name == "rustdist" else "gloo"
        self.dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                     world_size=world, timeout=self.timeout)

    def full(self, n: int, value: float, dtype: Any = np.float32) -> Any:
        """A buffer of `n` elements, each `value`."""
        arr = np.full(n, value, dtype=dtype)
        return arr if self.torch is None else self.torch.from_numpy(arr)

    def values(self, buf: Any) -> np.ndarray:
        """The buffer's elements as a numpy array."""
        return buf if self.torch is None else buf.numpy()

    def all_reduce(self, buf: Any) -> None:
        """Sum over the ranks, in place."""
        self.dist.all_reduce(buf)

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank (a float64 all_reduce with MAX)."""
        buf = self.full(1, 1.0 if flag else 0.0, np.float64)
        self.dist.all_reduce(buf, op=self.dist.ReduceOp.MAX)
        return bool(self.values(buf)[0] > 0)

    def barrier(self) -> None:
        """The side's barrier."""
        self.dist.barrier()

    def close(self) -> None:
        """Leaves the world."""
        self.dist.destroy_process_group()


def resources() -> dict[str, float]:
    """This process's threads, open fds (less the one that lists them) and RSS (MB)."""
    threads = len(os.listdir("/proc/self/task"))
    fds = len(os.listdir("/proc/self/fd")) - 1
    rss_kb = 0
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return {"threads": threads, "fds": fds, "rss_mb": rss_kb / 1024}


def cpu_seconds() -> float:
    """CPU time (user + system) of every thread of this process so far: the kernel's
    per-process clock (CLOCK_PROCESS_CPUTIME_ID, nanoseconds; os.times and /proc/self/stat
    count in 10 ms ticks, too coarse for a few seconds of idling)."""
    return time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)


def sum_ok(side: Side, buf: Any, world: int) -> bool:
    """Whether every element of `buf` is the all_reduce of rank + 1 over the ranks."""
    return bool(np.array_equal(side.values(buf),
                               np.full(len(side.values(buf)), world * (world + 1) / 2,
                                       dtype=np.float32)))


def time_case(side: Side, case: dict[str, Any], rank: int, world: int,
              rounds: int) -> dict[str, Any]:
    """One latency case: its result checked (all_reduce: element by element, on every rank;
    a case wrong on any rank is not timed), then `rounds` rounds of a barrier and
    ``case["calls"]`` back-to-back calls; this rank's mean seconds per call of each round."""
    call: Callable[[], None]
    ok = True
    if case["op"] == "barrier":
        call = side.barrier
    else:
        probe = side.full(case["elems"], rank + 1)
        side.all_reduce(probe)
        ok = sum_ok(side, probe, world)
        buf = side.full(case["elems"], 0.0)  # zeros: repeated sums stay finite

        def call() -> None:
            side.all_reduce(buf)
    wrong = side.any_rank(not ok)
    fields: dict[str, Any] = {"case": case["name"], "ok_here": ok, "correct": not wrong}
    if wrong:
        return fields
    for _ in range(min(5, case["calls"])):  # warm-up
        call()
    per_call = []
    for _ in range(rounds):
        side.barrier()
        t0 = time.perf_counter()
        for _ in range(case["calls"]):
            call()
        per_call.append((time.perf_counter() - t0) / case["calls"])
    fields["per_call_s"] = per_call
    return fields


def wait_for_start(run_dir: str) -> float:
    """Blocks until the launcher's start file appears; the common start (wall clock)."""
    path = os.path.join(run_dir, START_FILE)
    while not os.path.exists(path):
        time.sleep(START_POLL_S)
    with open(path, encoding="utf-8") as f:
        return float(json.load(f)["start_at"])


def die_with_parent(parent: Optional[int]) -> None:
    """The kernel kills this rank when the bench that started it dies (no orphans)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # it died before prctl
        os._exit(1)


def run(run_dir: str, cfg: dict[str, Any], rank: int, out: Out) -> None:
    """This rank's whole run: ready, init at the common start, the first collective,
    resources, then (unless the config says ``init_only``) idle CPU and the latency cases;
    each reported as an event."""
    world = cfg["world"]
    t_import = time.perf_counter()
    side = Side(cfg["side"], cfg["timeout_s"])
    out.emit("ready", import_s=time.perf_counter() - t_import, pid=os.getpid(),
             **{f"before_{k}": v for k, v in resources().items()})
    start_at = wait_for_start(run_dir)
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    side.init(rank, world)
    t1 = time.time()
    out.emit("init", late_s=t0 - start_at, init_s=t1 - start_at, own_init_s=t1 - t0)
    first = side.full(2, rank + 1)
    side.all_reduce(first)
    t2 = time.time()
    out.emit("first", first_s=t2 - start_at, ok=sum_ok(side, first, world))
    out.emit("resources", **resources())
    if not cfg.get("init_only"):
        measure(side, cfg, rank, out)
    out.emit("measured")
    side.barrier()  # the way out every program takes: a barrier, then destroy_process_group
    torch_loaded = "torch" in sys.modules
    side.close()
    out.emit("done", torch_loaded=torch_loaded)
    if cfg["side"] == "rustdist" and torch_loaded:
        raise RuntimeError("torch was imported by a rustdist rank of --scale")


def measure(side: Side, cfg: dict[str, Any], rank: int, out: Out) -> None:
    """Idle CPU, then the latency cases."""
    side.barrier()
    c0, w0 = cpu_seconds(), time.perf_counter()
    time.sleep(cfg["idle_s"])
    c1, w1 = cpu_seconds(), time.perf_counter()
    out.emit("idle", cpu_per_s=(c1 - c0) / (w1 - w0), window_s=w1 - w0)
    side.barrier()
    for case in cfg["cases"]:
        out.emit("case", **time_case(side, case, rank, cfg["world"], cfg["rounds"]))


def main(argv: Optional[list[str]] = None) -> None:
    """Runs this rank (RANK) of the world whose run folder is the only argument."""
    run_dir = (sys.argv[1:] if argv is None else argv)[0]
    rank = int(os.environ["RANK"])
    err = os.open(os.path.join(run_dir, f"rank{rank}.err"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 1)
    os.dup2(err, 2)
    os.close(err)
    parent = os.environ.get("RUSTDIST_SCALE_PARENT")
    die_with_parent(int(parent) if parent else None)
    with open(os.path.join(run_dir, CONFIG_FILE), encoding="utf-8") as f:
        cfg = json.load(f)
    with Out(run_dir, rank) as out:
        run(run_dir, cfg, rank, out)


if __name__ == "__main__":
    main()
