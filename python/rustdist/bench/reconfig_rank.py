"""One process of a ``--recovery`` reconfigure round: ``python -c BOOT reconfig_rank.py RUN``.

Run as a file, as ``scale_rank.py`` is (importing the package ``rustdist.bench`` imports
torch): a rustdist process imports rustdist with torch hidden and reduces numpy arrays, a gloo
process runs torch's gloo on torch tensors (``scale_rank.Side``). RANK and the run folder's
``reconfig.json`` (``side``, ``world``, ``scenario``, ``port``, ``timeout_s``) say what to do.

Ranks 0..world-1 make a group on a TCPStore (rank 0 serves it) with ``enable_reconfigure`` and
re-form it once over everyone's handles (gloo runs nothing before a reconfigure), warm up, and
meet at a barrier; then the last rank exits (``os._exit``, as a crash would) while the others
are blocked in a 1 MiB all_reduce. Each survivor catches the error and publishes its handle;
they reconfigure over their handles (``shrink``), or over theirs and a spare's (``replace``:
process ``world`` waited, initialised alone on the job's store, until asked), and run a first
all_reduce, checked. Each reports ``time.monotonic()`` (one clock on one host) at the death,
the error, the reconfigure's return and the first collective's end, as ``scale_rank.Out``
lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

CONFIG_FILE = "reconfig.json"
#: The all_reduce the survivors are blocked in when the victim dies.
BLOCKED_ELEMENTS = (1 << 20) // 4
#: How long the victim waits after the barrier: the survivors are inside the all_reduce.
VICTIM_DELAY_S = 0.05


def _scale_rank() -> Any:
    """``scale_rank.py`` (its Side and Out), loaded as a file like this one."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale_rank.py")
    spec = importlib.util.spec_from_file_location("_rustdist_scale_rank", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _handles(store: Any, prefix: str, ranks: list[int]) -> list[str]:
    return [store.get(f"{prefix}/{r}").decode() for r in ranks]


def main(run_dir: str) -> None:
    sr = _scale_rank()
    with open(os.path.join(run_dir, CONFIG_FILE), encoding="utf-8") as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), cfg["world"]
    side = sr.Side(cfg["side"], cfg["timeout_s"])
    dist = side.dist
    backend = "rustdist" if cfg["side"] == "rustdist" else "gloo"
    timeout = timedelta(seconds=cfg["timeout_s"])
    store = dist.TCPStore("127.0.0.1", cfg["port"], None, rank == 0, timeout=timeout,
                          wait_for_workers=False)
    victim, survivors = world - 1, list(range(world - 1))
    with sr.Out(run_dir, rank) as out:
        if rank == world:  # the spare
            store.wait(["needed"], timedelta(seconds=600))
            dist.init_process_group(backend, world_size=1, rank=0, store=store, timeout=timeout,
                                    enable_reconfigure=True)
            store.set(f"after/{rank}", dist._get_reconfigure_handle())
        else:
            dist.init_process_group(backend, world_size=world, rank=rank, store=store,
                                    timeout=timeout, enable_reconfigure=True)
            store.set(f"first/{rank}", dist._get_reconfigure_handle())
            dist._reconfigure(0, _handles(store, "first", list(range(world)))).wait()
            for _ in range(3):  # every link is up
                side.all_reduce(side.full(1024, 1.0))
            side.barrier()
            if rank == victim:
                time.sleep(VICTIM_DELAY_S)  # a benchmark's pacing: the others are waiting
                out.emit("death", t=time.monotonic())
                os._exit(0)
            try:
                side.all_reduce(side.full(BLOCKED_ELEMENTS, 1.0))
            except RuntimeError:
                t_error = time.monotonic()
            else:
                raise RuntimeError("all_reduce returned although a rank died")
            store.set(f"after/{rank}", dist._get_reconfigure_handle())
            if cfg["scenario"] == "replace" and rank == 0:
                store.set("needed", "1")
        members = survivors + ([world] if cfg["scenario"] == "replace" else [])
        dist._reconfigure(1, _handles(store, "after", members)).wait()
        t_reformed = time.monotonic()
        probe = side.full(256, 1.0)
        side.all_reduce(probe)
        t_first = time.monotonic()
        if not np.all(side.values(probe) == float(len(members))):
            raise RuntimeError(f"wrong all_reduce after the reconfigure: {side.values(probe)[:4]}")
        if rank == world:
            out.emit("joined", reformed=t_reformed, first=t_first)
        else:
            out.emit("recovered", error=t_error, reformed=t_reformed, first=t_first)
        side.close()


if __name__ == "__main__":
    main(sys.argv[1])
