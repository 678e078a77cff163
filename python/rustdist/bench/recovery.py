"""``--recovery``: how long the survivors of a dead rank take to work again through
``shrink_group``.

In each world the last rank exits (``os._exit``, as a crash would) while the others are
blocked in a 1 MiB all_reduce it never joins; each survivor catches the error, shrinks the
default group excluding it and runs a first all_reduce on the shrunk group. A rank reports
``time.monotonic()`` at each point (one clock on one host, and on the test hosts, which
share the kernel), so the launcher can measure from the death: the error (detection), the
shrink's return, and the end of the first collective (recovery). A world is started afresh
for every round, since a round uses up a rank.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

import rustdist as rd

from .common import Config
from .launch import Emitter

#: The collective the survivors are blocked in when the victim dies.
BLOCKED_BYTES = 1 << 20
#: How long the victim waits after the barrier: the survivors are inside the all_reduce.
VICTIM_DELAY_S = 0.05


def recovery_rank(cfg: Config, rank: int, out: Emitter) -> None:
    """One rank of a recovery round (see the module docstring)."""
    for _ in range(3):  # every link and the workspace are up
        rd.all_reduce(torch.ones(1024))
    victim = cfg.world - 1
    rd.barrier()
    if rank == victim:
        time.sleep(VICTIM_DELAY_S)  # a benchmark's pacing: the others are waiting for it
        out.emit("death", t=time.monotonic())
        out.close()
        os._exit(0)
    try:
        rd.all_reduce(torch.ones(BLOCKED_BYTES // 4))
    except RuntimeError:  # DistNetworkError, or DistBackendError relayed by a peer
        t_error = time.monotonic()
    else:
        raise RuntimeError("all_reduce returned although a rank died")
    rd.shrink_group([victim])
    t_shrunk = time.monotonic()
    probe = torch.ones(256)
    rd.all_reduce(probe)
    t_first = time.monotonic()
    if not torch.equal(probe, torch.full((256,), float(cfg.world - 1))):
        raise RuntimeError(f"wrong all_reduce after the shrink: {probe[:4]}")
    out.emit("recovered", error=t_error, shrunk=t_shrunk, first=t_first)


def round_result(events: list[dict[str, Any]]) -> dict[str, float]:
    """A round's figures in milliseconds from the death, the slowest survivor's each:
    ``detected`` (its error), ``shrunk`` (shrink_group returned), ``recovered`` (the first
    collective on the shrunk group ended)."""
    death = next(ev["t"] for ev in events if ev["event"] == "death")
    done = [ev for ev in events if ev["event"] == "recovered"]
    return {what: max(ev[key] - death for ev in done) * 1e3
            for what, key in (("detected", "error"), ("shrunk", "shrunk"),
                              ("recovered", "first"))}


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max over rounds of each figure."""
    return {what: {"median": statistics.median(r[what] for r in rounds),
                   "min": min(r[what] for r in rounds), "max": max(r[what] for r in rounds)}
            for what in ("detected", "shrunk", "recovered")}


def table_row(links: str, world: int, summary: dict[str, Any]) -> str:
    """One printed row: the links, the world and each figure's median (min-max)."""
    cells = "".join(f" | {s['median']:7.1f} ({s['min']:.1f}-{s['max']:.1f})"
                    for s in (summary[w] for w in ("detected", "shrunk", "recovered")))
    return f"{links:>24} | {world:5d}{cells}"


TABLE_HEADER = (f"{'links':>24} | world | detected ms (min-max) | shrunk ms (min-max) | "
                "first collective ms (min-max)")
