"""Where one shared-memory algorithm of a collective (all_reduce, broadcast or all_gather)
overtakes another: the same sizes and dtypes run with each algorithm forced
(``RUSTDIST_ALGO=<op>=<name>``), in turn, for a number of rounds, through the import-swap door,
ranks started here on this host.

    python tools/crossover.py --algos shm_oneshot shm_twoshot \
        --dtype float32 16K 32K 64K 128K --dtype bfloat16 4K 8K 16K --runs 3
    python tools/crossover.py --op broadcast --algos shm shm_single_copy \
        --dtype float32 512K 1M 4M --runs 3

Each cell is the slowest rank's mean time per call (us) in a round of about 20 ms, the median
of 7 rounds; a line per case gives every run of every algorithm, so the spread shows. Sums of
ones double each call (to inf, at the same speed as finite values); broadcasts are from rank 0;
an all_gather's size is each rank's input (all_gather_into_tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROUNDS = 7
ROUND_BYTES = 20_000_000


def parse_size(text: str) -> int:
    """``64K``, ``2M`` or a plain number of bytes."""
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1].upper(), 1)
    return int(text.rstrip("KkMm")) * scale


def rank_main(op: str, cases: list[tuple[str, int]]) -> None:
    """One rank: times `op` in every case and, on rank 0, prints {case: us} as JSON."""
    import torch

    import rustdist as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = {}
    for dtype, nbytes in cases:
        t = torch.ones(nbytes // torch.tensor([], dtype=getattr(torch, dtype)).element_size(),
                       dtype=getattr(torch, dtype))
        gathered = t.new_empty(world * t.numel())
        call = {"all_reduce": dist.all_reduce,
                "broadcast": lambda t: dist.broadcast(t, src=0),
                "all_gather": lambda t, out=gathered: dist.all_gather_into_tensor(out, t)}[op]
        iters = max(30, ROUND_BYTES // nbytes)
        for _ in range(5):
            call(t)
        rounds = []
        for _ in range(ROUNDS):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call(t)
            us = torch.tensor([(time.perf_counter() - start) / iters * 1e6])
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            rounds.append(us.item())
        out[f"{dtype} {nbytes}"] = statistics.median(rounds)
    if rank == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(op: str, algo: str, world: int, cases: list[tuple[str, int]]) -> dict[str, float]:
    """The ranks of one run of `op` with `algo` forced (``auto``: the selection's own
    choice)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world))
    if algo != "auto":
        env["RUSTDIST_ALGO"] = f"{op}={algo}"
    arg = json.dumps([op, cases])
    procs = [subprocess.Popen([sys.executable, __file__, "--rank-cases", arg],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{algo}: a rank failed")
    return json.loads(outs[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=["all_reduce", "broadcast", "all_gather"],
                   default="all_reduce")
    p.add_argument("--algos", nargs="+", default=["shm_oneshot", "shm_twoshot"])
    p.add_argument("--dtype", nargs="+", action="append", metavar=("DTYPE", "SIZE"),
                   help="a dtype and its sizes (64K, 2M); repeat for more dtypes")
    p.add_argument("--runs", type=int, default=3, help="runs of every algorithm, in turn")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--json", help="where to write every run's figures")
    p.add_argument("--rank-cases", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_cases:
        op, cases = json.loads(args.rank_cases)
        rank_main(op, [tuple(c) for c in cases])
        return
    cases = [(d[0], parse_size(s)) for d in args.dtype or [["float32", "64K"]] for s in d[1:]]
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in args.algos}
    for _ in range(args.runs):
        for algo in args.algos:
            runs[algo].append(run_once(args.op, algo, args.world, cases))
    print("| case | " + " | ".join(f"{a} (us)" for a in args.algos) + " |")
    print("|---|" + "---|" * len(args.algos))
    for dtype, nbytes in cases:
        key = f"{dtype} {nbytes}"
        cells = [", ".join(f"{r[key]:.1f}" for r in runs[a]) for a in args.algos]
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        print(f"| {dtype} {size} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"op": args.op, "world": args.world, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
