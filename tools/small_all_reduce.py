"""The 8-byte all_reduce through both front doors, for A/B runs of a change on the fast path
(install each build's wheel in turn, run this after each):

    python tools/small_all_reduce.py --label before
    python tools/small_all_reduce.py --label after

Two ranks on this host (spawned here), a torch tensor of two float32: ``rustdist.all_reduce``
(the import swap) and ``torch.distributed.all_reduce`` on rustdist's group (the torch door),
synchronous. Each figure is the slowest rank's mean time per call (us) over a round of
``--iters`` calls, the median of ``--rounds`` rounds, after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int, iters: int, rounds: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as td

    import rustdist as rd

    rd.init_process_group("rustdist", rank=rank, world_size=world)
    t = torch.ones(2)
    medians = {}
    for door, call in (("import swap", lambda: rd.all_reduce(t)),
                       ("torch door", lambda: td.all_reduce(t))):
        for _ in range(iters // 2):
            call()
        per_call = []
        for _ in range(rounds):
            rd.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            slowest = torch.tensor([(time.perf_counter() - t0) / iters * 1e6],
                                   dtype=torch.float64)
            rd.all_reduce(slowest, op=rd.ReduceOp.MAX)
            per_call.append(slowest.item())
        medians[door] = statistics.median(per_call)
    if rank == 0:
        out.put(medians)
    rd.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="", help="printed in front of the figures")
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    ranks = [ctx.Process(target=_rank, args=(r, 2, port, args.iters, args.rounds, out))
             for r in range(2)]
    for r in ranks:
        r.start()
    medians = out.get()
    for r in ranks:
        r.join()
    print(args.label, " ".join(f"{door}: {us:.2f} us" for door, us in medians.items()))


if __name__ == "__main__":
    main()
