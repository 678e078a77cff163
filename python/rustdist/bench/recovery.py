"""``--recovery``: how long the survivors of a dead rank take to work again, through
torch 2.14's reconfigure beside gloo (the default), or through ``shrink_group``
(``--recovery-api shrink_group``, rustdist alone).

Through reconfigure (``reconfig_rank.py`` has a round): the survivors re-form the group over
their handles (``shrink``) or over theirs and a spare process's (``replace``); rustdist's
processes run on numpy arrays (no torch), gloo's on torch tensors, on one host.

Through shrink_group:
In each world the last rank exits (``os._exit``, as a crash would) while the others are
blocked in a 1 MiB all_reduce it never joins; each survivor catches the error, shrinks the
default group excluding it and runs a first all_reduce on the shrunk group. A rank reports
``time.monotonic()`` at each point (one clock on one host, and on the test hosts, which
share the kernel), so the launcher can measure from the death: the error (detection), the
shrink's return, and the end of the first collective (recovery). A world is started afresh
for every round, since a round uses up a rank.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import torch

import rustdist as rd

from . import reconfig_rank, scale
from .common import Config
from .launch import Emitter, Follower, free_port, stop

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


# ---------------------------------------------------------------------------------------------
# Through reconfigure, beside gloo (reconfig_rank.py has the round)

#: Scenarios of a reconfigure round: the survivors re-form alone, or with a spare process.
SCENARIOS = ("shrink", "replace")
#: Memory a torch (gloo) process takes, for whether a gloo world fits (MB).
TORCH_RANK_MB = 600
#: Group timeout in a round: a side that never sees the death fails the round after it.
ROUND_TIMEOUT_S = 30.0


def gloo_fits(world: int) -> bool:
    """Whether a gloo world (its ranks and a spare, torch each) fits in the memory free now."""
    free = scale.mem_available_mb()
    return free is None or (world + 1) * TORCH_RANK_MB < 0.8 * free


def reconfigure_round(side: str, world: int, scenario: str) -> dict[str, float]:
    """One round on `side` ("rustdist" or "gloo"): ms from the death to the slowest member's
    error (``detected``), reconfigure's return (``reformed``) and first collective's end
    (``recovered``). Raises RuntimeError when a process fails or the round outlives
    ROUND_TIMEOUT_S twice over."""
    procs = world + (1 if scenario == "replace" else 0)
    with tempfile.TemporaryDirectory(prefix="rustdist-recovery-") as run_dir:
        with open(os.path.join(run_dir, reconfig_rank.CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump({"side": side, "world": world, "scenario": scenario,
                       "port": free_port(), "timeout_s": ROUND_TIMEOUT_S}, f)
        cmd = [sys.executable, "-c", scale.BOOT, reconfig_rank.__file__, run_dir]
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        logs = [open(os.path.join(run_dir, f"rank{r}.err"), "wb") for r in range(procs)]
        handles = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "OMP_NUM_THREADS": "1"},
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
                   for r, log in enumerate(logs)]
        try:
            deadline = time.monotonic() + 2 * ROUND_TIMEOUT_S + world
            while any(h.poll() is None for h in handles) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            for log in logs:
                log.close()
            stop(handles)
        events = Follower(run_dir, procs).poll()
        done = [ev for ev in events if ev["event"] in ("recovered", "joined")]
        if len(done) != procs - 1:
            tails = [scale.error_lines(run_dir, [r]) for r in range(procs)]
            raise RuntimeError(f"{side} world {world} {scenario}: {len(done)} of {procs - 1} "
                               f"members recovered; {tails}")
    death = next(ev["t"] for ev in events if ev["event"] == "death")
    detected = [ev["error"] - death for ev in done if "error" in ev]
    return {"detected": max(detected) * 1e3,
            "reformed": max(ev["reformed"] - death for ev in done) * 1e3,
            "recovered": max(ev["first"] - death for ev in done) * 1e3}


def reconfigure_summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max over rounds of each reconfigure figure."""
    return {what: {"median": statistics.median(r[what] for r in rounds),
                   "min": min(r[what] for r in rounds), "max": max(r[what] for r in rounds)}
            for what in ("detected", "reformed", "recovered")}


RECONFIGURE_HEADER = (f"{'scenario':>8} | world | {'rustdist: detected':>18} | "
                      f"{'recovered ms':>22} | {'gloo: detected':>14} | {'recovered ms':>22} | "
                      "gloo/rustdist")


def reconfigure_row(scenario: str, world: int, rust: dict[str, Any],
                    gloo: Optional[dict[str, Any]]) -> str:
    """One printed row: each side's detection and recovery, median (min-max), and the ratio
    of the medians of recovery (gloo over rustdist: above 1, rustdist recovers first)."""
    def cells(s: Optional[dict[str, Any]]) -> str:
        if s is None:
            return f"{'-':>18} | {'(does not fit)':>22}"
        r = s["recovered"]
        return (f"{s['detected']['median']:18.1f} | "
                f"{r['median']:8.1f} ({r['min']:.1f}-{r['max']:.1f})".rjust(22))

    ratio = "-" if gloo is None else f"{gloo['recovered']['median'] / rust['recovered']['median']:.2f}"
    return f"{scenario:>8} | {world:5d} | {cells(rust)} | {cells(gloo)} | {ratio}"
