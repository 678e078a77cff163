"""``--soak``: many mixed operations through rustdist, watching for leaks.

Every rank runs the same pseudo-random sequence (one seed): the five collectives at sizes
from 8 B to 1 MiB, isend/irecv pairs around the ring, and a ``new_group``, one all_reduce on
it and its ``destroy_process_group`` every 10,000 operations. After a warm-up (1,000
operations and one group) and then every 10,000 operations each rank samples its resident
memory (``/proc/self/statm``), open file descriptors (``/proc/self/fd``) and threads
(``/proc/self/task``), and checks one all_reduce's result. A rank passes when its last sample
is within 5% of its first in RSS and equal to it in fds and threads. The ranks inherit the
environment: ``RUSTDIST_SHM=0`` runs the soak over TCP.
"""

from __future__ import annotations

import os
import random
import resource
import time
from typing import Any

import torch

import rustdist as rd

from .common import ELEM, OPS, SIZES, Config, layout
from .launch import Emitter
from .sides import check, torch_side

SAMPLE_EVERY = 10_000
GROUP_EVERY = 10_000
WARMUP_OPS = 1_000
MAX_BYTES = 1 << 20
RSS_TOLERANCE = 0.05
KINDS = (*OPS, "p2p")
SEED = 0


def usage() -> dict[str, Any]:
    """This process's resident memory (MiB), open file descriptors and threads."""
    with open("/proc/self/statm", encoding="ascii") as f:
        rss_pages = int(f.read().split()[1])
    return {"rss_mib": rss_pages * resource.getpagesize() / 2**20,
            "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task"))}


def soak_rank(cfg: Config, rank: int, out: Emitter) -> None:
    """This rank's part of the soak; every rank reports its samples."""
    world = cfg.world
    sizes = [s for s in SIZES if s <= MAX_BYTES]
    rng = random.Random(SEED)
    side = torch_side("rustdist", rd)
    # Views of two preallocated buffers: the soak watches the engine, not torch's allocator.
    a = torch.zeros(MAX_BYTES // ELEM)
    b = torch.zeros(MAX_BYTES // ELEM)
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def one() -> None:
        kind, size = rng.choice(KINDS), rng.choice(sizes)
        if kind == "p2p":
            n = size // ELEM
            works = [rd.isend(a[:n], dst=nxt), rd.irecv(b[:n], src=prv)]
            for w in works:
                w.wait()
            return
        lay = layout(kind, size, world)
        side.make_call(kind, a[:lay.n_in], b[:lay.n_out])()

    def group_cycle() -> None:
        g = rd.new_group()
        rd.all_reduce(a[:2], group=g)
        rd.destroy_process_group(g)

    def sample(ops: int) -> None:
        lay = layout("all_reduce", 64, world)
        ok = check(side.make_call("all_reduce", a[:lay.n_in], b[:0]), lay, rank, a[:lay.n_in],
                   b[:0])
        now = usage()
        # No rank moves on (after the last sample: leaves the world, which closes the store
        # connections and threads rank 0 serves) before every rank has sampled.
        rd.barrier()
        out.emit("sample", ops=ops, correct=ok, seconds=time.perf_counter() - start, **now)

    for _ in range(WARMUP_OPS):
        one()
    group_cycle()
    start = time.perf_counter()
    sample(0)
    for i in range(1, cfg.soak_ops + 1):
        one()
        if i % GROUP_EVERY == 0:
            group_cycle()
        if i % SAMPLE_EVERY == 0 or i == cfg.soak_ops:
            sample(i)


def verdict(samples: list[dict[str, Any]]) -> list[str]:
    """What failed, per rank (empty: passed): the last sample against the first."""
    problems = []
    for rank in sorted({s["rank"] for s in samples}):
        mine = sorted((s for s in samples if s["rank"] == rank), key=lambda s: s["ops"])
        first, last = mine[0], mine[-1]
        growth = last["rss_mib"] / first["rss_mib"] - 1
        if growth > RSS_TOLERANCE:
            problems.append(f"rank {rank}: RSS grew {growth:.1%} ({first['rss_mib']:.1f} -> "
                            f"{last['rss_mib']:.1f} MiB), more than {RSS_TOLERANCE:.0%}")
        for key in ("fds", "threads"):
            if last[key] != first[key]:
                problems.append(f"rank {rank}: {key} {first[key]} -> {last[key]}")
        wrong = [s["ops"] for s in mine if not s["correct"]]
        if wrong:
            problems.append(f"rank {rank}: wrong all_reduce result at ops {wrong}")
    return problems


def table_header(world: int) -> str:
    """The header of the samples table (one column group per metric, a value per rank)."""
    ranks = f"rank 0..{world - 1}"
    return f"{'ops':>8} | {'RSS MiB, ' + ranks:<{8 * world}} | {'fds':<{5 * world}} | threads"


def table_row(ops: int, by_rank: dict[int, dict[str, Any]]) -> str:
    """One line of the samples table: `ops` and every rank's sample at it."""
    ranks = sorted(by_rank)
    rss = " ".join(f"{by_rank[r]['rss_mib']:7.1f}" for r in ranks)
    fds = " ".join(f"{by_rank[r]['fds']:4d}" for r in ranks)
    threads = " ".join(f"{by_rank[r]['threads']:3d}" for r in ranks)
    return f"{ops:>8} | {rss:<{8 * len(ranks)}} | {fds:<{5 * len(ranks)}} | {threads}"
