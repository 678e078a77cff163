"""torchft's reconfigure time per quorum change: rustdist vs torchft's gloo groups.

Run as ``python -m rustdist.bench.torchft`` (``--help`` for the options).

What torchft's Manager pays on every quorum change is ``ProcessGroup.configure()`` on every
rank: the previous incarnation aborted, a store client on the new prefix, the new group
built. Gloo and rustdist connect their peers there; the first collective is timed with it
all the same, so that a backend that connects lazily pays it too. Measured for
:class:`rustdist.torchft.ProcessGroupRustdist` and torchft's ``ProcessGroupGloo`` and
``ProcessGroupBabyGloo`` (gloo in a subprocess per rank, started by each ``configure``) in
the same run.

Method. The ranks of a world are threads of this process (as in torchft's
``MultiPgBaseTest``), one TCPStore on 127.0.0.1. For each backend and world size every rank
configures once (not timed), then ``--changes`` times on a fresh prefix with the next
quorum id: the ranks leave a barrier together, each calls ``configure()`` and then a
1-element allreduce (checked) and waits for it. A change's time is from the barrier to the
last rank's allreduce done; ``configure`` alone is the slowest rank's call. Rows report the
median, min and max over the changes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
from torch.distributed import ReduceOp, TCPStore
from torchft.process_group import ProcessGroup, ProcessGroupBabyGloo, ProcessGroupGloo

from ..torchft import ProcessGroupRustdist
from .common import machine

#: The backends compared, by the name rows carry, and how a rank makes its group.
BACKENDS: dict[str, Callable[[timedelta], ProcessGroup]] = {
    "ProcessGroupRustdist": lambda t: ProcessGroupRustdist(timeout=t),
    "ProcessGroupGloo": lambda t: ProcessGroupGloo(timeout=t),
    "ProcessGroupBabyGloo": lambda t: ProcessGroupBabyGloo(timeout=t),
}
TIMEOUT = timedelta(seconds=60)


def _change(pgs: list[ProcessGroup], addr: str, quorum: int) -> tuple[float, float]:
    """One quorum change on every rank: (barrier to the last rank's first allreduce done,
    the slowest rank's configure), in seconds."""
    world = len(pgs)
    gate = threading.Barrier(world + 1)

    def rank_main(rank: int) -> tuple[float, float]:
        gate.wait()
        start = time.perf_counter()
        pgs[rank].configure(addr, "0", rank, world, quorum_id=quorum)
        configured = time.perf_counter()
        t = torch.ones(1)
        pgs[rank].allreduce([t], ReduceOp.SUM).wait()
        if t.item() != world:
            raise RuntimeError(f"allreduce after configure gave {t.item()}, not {world}")
        return configured - start, time.perf_counter()

    with ThreadPoolExecutor(world) as ex:
        futures = [ex.submit(rank_main, r) for r in range(world)]
        gate.wait()
        start = time.perf_counter()
        done = [f.result() for f in futures]
    return max(end for _, end in done) - start, max(c for c, _ in done)


def measure(backend: str, world: int, changes: int, port: int) -> dict[str, Any]:
    """``changes`` timed quorum changes of ``backend`` on ``world`` ranks (threads)."""
    pgs = [BACKENDS[backend](TIMEOUT) for _ in range(world)]
    prefix = f"127.0.0.1:{port}/bench/{backend}/{world}"
    try:
        _change(pgs, f"{prefix}/0", 0)  # the first configure: not a change
        times = [_change(pgs, f"{prefix}/{q}", q) for q in range(1, changes + 1)]
    finally:
        for pg in pgs:
            pg.shutdown()
    total = [t for t, _ in times]
    return {
        "backend": backend,
        "world": world,
        "changes_s": total,
        "configure_s": [c for _, c in times],
        "median_s": statistics.median(total),
        "min_s": min(total),
        "max_s": max(total),
        "configure_median_s": statistics.median(c for _, c in times),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, each with its ratio to rustdist's median."""
    lines = ["| world | backend | median | min | max | configure() alone (median) "
             "| vs rustdist |", "|---|---|---|---|---|---|---|"]
    ours = {r["world"]: r["median_s"] for r in rows if r["backend"] == "ProcessGroupRustdist"}
    for r in rows:
        ratio = (f"{r['median_s'] / ours[r['world']]:.1f}x" if r["world"] in ours
                 else "")
        lines.append(f"| {r['world']} | {r['backend']} | {_ms(r['median_s'])} | "
                     f"{_ms(r['min_s'])} | {_ms(r['max_s'])} | "
                     f"{_ms(r['configure_median_s'])} | {ratio} |")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def main(argv: Optional[list[str]] = None) -> int:
    """Runs every backend on every world size, prints the table, writes ``--json``."""
    p = argparse.ArgumentParser(prog="python -m rustdist.bench.torchft",
                                description=(__doc__ or "").splitlines()[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 3],
                   help="world sizes (default: 2 3)")
    p.add_argument("--changes", type=int, default=10,
                   help="timed quorum changes per backend and world (default: 10)")
    p.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS),
                   help="backends to run (default: all)")
    p.add_argument("--json", metavar="PATH", help="also write the results there")
    args = p.parse_args(argv)
    if args.changes < 1 or min(args.world) < 1:
        p.error("--changes and --world need positive numbers")
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    rows = []
    for world in args.world:
        for backend in args.backends:
            rows.append(measure(backend, world, args.changes, store.port))
            r = rows[-1]
            print(f"world {world} {backend}: median {_ms(r['median_s'])}", file=sys.stderr)
    info = machine()
    print(f"torchft reconfigure time per quorum change (configure() + first allreduce), "
          f"ranks as threads of one process, {args.changes} changes each; "
          f"{info['cpu']}, {info['usable_cores']} cores, torch {info['torch']}")
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "argv": sys.argv[1:], "changes": args.changes,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
