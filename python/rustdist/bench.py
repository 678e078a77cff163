"""Benchmark rustdist against torch.distributed's gloo, side by side.

Run as ``python -m rustdist.bench``. For each world size, ``world`` processes are spawned once;
each joins two independent worlds, torch.distributed with backend "gloo" and rustdist, on two
free ports of 127.0.0.1. For every (op, size) both sides are checked for a correct result,
warmed up, then timed in alternating rounds (rustdist, gloo, gloo, rustdist, ...). A round is
a barrier followed by N back-to-back calls (same N for both sides); its latency is the slowest
rank's mean time per call, and a row reports the median over rounds. Bandwidths follow
nccl-tests: algbw = bytes / time and busbw = algbw * 2(n-1)/n for all_reduce, algbw for
broadcast, algbw * (n-1)/n for all_gather, where all_gather's bytes (and its size column) are
the full gathered tensor. Speed-up = gloo time / rustdist time.

It also measures the torch front door: an 8-byte all_reduce through ``torch.distributed`` on a
group torch created with backend "rustdist" (``new_group(backend="rustdist")``), against the same
call through rustdist's own API, timed the same way; the difference is the front door's cost.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import socket
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as td

import rustdist as rd

OPS = ("all_reduce", "broadcast", "all_gather")
# The two sides; rounds alternate between them.
DISTS: dict[str, Any] = {"rustdist": rd, "gloo": td}
SIDES = tuple(DISTS)
SIZES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)
ELEM = 4  # float32
# Collective timeout of both worlds: a hung peer becomes an error instead of a stuck bench.
OP_TIMEOUT = timedelta(seconds=120)


@dataclass(frozen=True)
class Config:
    """What every worker of one world size runs."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    rounds: int
    round_seconds: float
    max_iters: int


def _busbw_factor(op: str, world: int) -> float:
    """nccl-tests' bus bandwidth factor (busbw = algbw * factor)."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op == "all_gather":
        return (world - 1) / world
    return 1.0


def _per_rank_elems(op: str, size: int, world: int) -> int:
    """Elements of each rank's input: all_gather's size is the gathered tensor."""
    elems = size // ELEM
    return max(1, elems // world) if op == "all_gather" else elems


def _make_call(dist: Any, op: str, inp: torch.Tensor, out: torch.Tensor) -> Callable[[], Any]:
    """One blocking call of `op` through `dist` (rustdist or torch.distributed)."""
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if op == "broadcast":
        return lambda: dist.broadcast(inp, src=0)
    return lambda: dist.all_gather_into_tensor(out, inp)


def _check(dist: Any, name: str, op: str, rank: int, world: int, inp: torch.Tensor,
           out: torch.Tensor) -> None:
    """Runs `op` once on rank-dependent data and raises if the result is wrong."""
    inp.fill_(rank + 1)
    _make_call(dist, op, inp, out)()
    if op == "all_reduce":
        ok = bool((inp == world * (world + 1) / 2).all())
    elif op == "broadcast":
        ok = bool((inp == 1).all())
    else:
        want = torch.arange(1, world + 1, dtype=out.dtype).repeat_interleave(inp.numel())
        ok = torch.equal(out, want)
    if not ok:
        raise RuntimeError(f"{name} {op} of {inp.numel()} floats: wrong result on rank {rank}")
    # Zeros keep repeated all_reduce sums finite and free of denormals.
    inp.zero_()


def _bench_case(rank: int, world: int, op: str, size: int, cfg: Config) -> Optional[dict]:
    """Times one (op, size) on both sides; returns the row on rank 0."""
    n = _per_rank_elems(op, size, world)
    out_elems = n * world if op == "all_gather" else 0
    calls = {}
    for name, dist in DISTS.items():
        inp = torch.empty(n, dtype=torch.float32)
        out = torch.empty(out_elems, dtype=torch.float32)
        _check(dist, name, op, rank, world, inp, out)
        calls[name] = (dist, _make_call(dist, op, inp, out))

    # Calibrate N from a few warm calls. Both sides run the same N (a round's first call
    # absorbs the barrier's skew, so equal N keeps that cost equal), and every rank must agree
    # on N, so it comes from the slowest rank's estimates.
    warm = 10 if size < (1 << 20) else 3 if size < (16 << 20) else 1
    est = torch.zeros(len(SIDES), dtype=torch.float64)
    for i, name in enumerate(SIDES):
        call = calls[name][1]
        call()
        t0 = time.perf_counter()
        for _ in range(warm):
            call()
        est[i] = (time.perf_counter() - t0) / warm
    td.all_reduce(est, op=td.ReduceOp.MAX)
    iters = int(min(cfg.max_iters, max(1.0, cfg.round_seconds / float(est.mean()))))

    def barrier() -> None:
        rd.barrier()
        td.barrier()

    per_call = _time_rounds([calls[name][1] for name in SIDES], barrier, cfg, iters)
    if rank != 0:
        return None

    nbytes = (out_elems if op == "all_gather" else n) * ELEM
    row: dict[str, Any] = {"world": world, "op": op, "bytes": nbytes, "iters": iters}
    for i, name in enumerate(SIDES):
        rounds_us = [t * 1e6 for t in per_call[i].tolist()]
        us = statistics.median(rounds_us)
        row[f"{name}_rounds_us"] = rounds_us
        row[f"{name}_us"] = us
        row[f"{name}_busbw_gbps"] = nbytes / (us * 1e-6) / 1e9 * _busbw_factor(op, world)
    row["speedup"] = row["gloo_us"] / row["rustdist_us"]
    return row


def _time_rounds(calls: list[Callable[[], Any]], barrier: Callable[[], Any], cfg: Config,
                 iters: int) -> torch.Tensor:
    """Per-call seconds of each of `calls`, per round (slowest rank's). ABBA order: which call
    goes first alternates between rounds, so order effects cancel out."""
    per_call = torch.zeros(len(calls), cfg.rounds, dtype=torch.float64)
    for r in range(cfg.rounds):
        for i in range(len(calls)) if r % 2 == 0 else reversed(range(len(calls))):
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                calls[i]()
            per_call[i, r] = (time.perf_counter() - t0) / iters
    td.all_reduce(per_call, op=td.ReduceOp.MAX)
    return per_call


def _front_door_case(rank: int, world: int, cfg: Config) -> Optional[dict]:
    """8-byte all_reduce: rustdist's own API vs torch.distributed on a rustdist group."""
    via_torch = td.new_group(backend="rustdist")
    own, door = torch.zeros(2), torch.zeros(2)
    calls = [lambda: rd.all_reduce(own), lambda: td.all_reduce(door, group=via_torch)]
    for call in calls:
        for _ in range(50):
            call()
    per_call = _time_rounds(calls, rd.barrier, cfg, iters=500 if cfg.rounds > 5 else 200)
    td.destroy_process_group(via_torch)
    if rank != 0:
        return None
    own_us, door_us = (statistics.median(t * 1e6 for t in per_call[i].tolist()) for i in (0, 1))
    return {"world": world, "op": "front_door", "bytes": 8, "rustdist_us": own_us,
            "torch_front_door_us": door_us, "overhead_us": door_us - own_us}


def _worker(rank: int, world: int, gloo_port: int, rd_port: int, cfg: Config,
            results: Any) -> None:
    """One rank: joins both worlds, runs every case, rank 0 streams rows to the parent."""
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    # Intra-op threads would only compete with the ranks for the cores.
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(rd_port)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                          world_size=world, timeout=OP_TIMEOUT)
    rd.init_process_group("rustdist", init_method="env://", rank=rank, world_size=world,
                          timeout=OP_TIMEOUT)
    for op in cfg.ops:
        for size in cfg.sizes:
            row = _bench_case(rank, world, op, size, cfg)
            if row is not None:
                results.put(row)
    row = _front_door_case(rank, world, cfg)
    if row is not None:
        results.put(row)
    rd.destroy_process_group()
    td.destroy_process_group()


def _free_ports(count: int) -> list[int]:
    """Ports the kernel reports free on 127.0.0.1 (held open together so they differ)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _fmt_size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _parse_size(text: str) -> int:
    """`67108864`, `64M`, `64MiB`, `4k`, ... as bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    shift = {"k": 10, "m": 20, "g": 30}.get(t[-1:], 0)
    try:
        return int(t[:-1] if shift else t) << shift
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def _world_size(text: str) -> int:
    n = int(text)
    if n < 2:
        raise argparse.ArgumentTypeError("world sizes start at 2")
    return n


HEADER = (f"{'size':>8} | {'rustdist us':>11} | {'gloo us':>10} | {'rustdist busbw GB/s':>19} | "
          f"{'gloo busbw GB/s':>15} | {'speed-up':>8}")


def _fmt_row(row: dict) -> str:
    return (f"{_fmt_size(row['bytes']):>8} | {row['rustdist_us']:>11.1f} | "
            f"{row['gloo_us']:>10.1f} | {row['rustdist_busbw_gbps']:>19.3f} | "
            f"{row['gloo_busbw_gbps']:>15.3f} | {row['speedup']:>7.2f}x")


def _run_world(world: int, cfg: Config) -> list[dict]:
    """Spawns `world` ranks, prints each (op) table as rows arrive, returns the rows."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gloo_port, rd_port = _free_ports(2)
    procs = [ctx.Process(target=_worker, args=(r, world, gloo_port, rd_port, cfg, results),
                         name=f"bench-rank{r}") for r in range(world)]
    for p in procs:
        p.start()
    rows: list[dict] = []
    expected = len(cfg.ops) * len(cfg.sizes) + 1  # + the front-door row
    try:
        while len(rows) < expected:
            try:
                row = results.get(timeout=1.0)
            except queue.Empty:
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed or all(p.exitcode == 0 for p in procs):
                    codes = ", ".join(f"{p.name}={p.exitcode}" for p in procs)
                    raise RuntimeError(f"world {world}: a rank exited early ({codes})") from None
                continue
            rows.append(row)
            if row["op"] == "front_door":
                print(f"\nworld {world} · 8 B all_reduce, torch front door: "
                      f"torch.distributed on a rustdist group {row['torch_front_door_us']:.1f} us, "
                      f"rustdist API {row['rustdist_us']:.1f} us, "
                      f"overhead {row['overhead_us']:.1f} us", flush=True)
                continue
            if len(rows) == 1 or rows[-2]["op"] != row["op"]:
                print(f"\nworld {world} · {row['op']} (float32)\n{HEADER}", flush=True)
            print(_fmt_row(row), flush=True)
        for p in procs:
            p.join()
        codes = [p.exitcode for p in procs]
        if any(codes):
            raise RuntimeError(f"world {world}: ranks exited with {codes}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    return rows


def _machine() -> dict[str, Any]:
    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rustdist": rd.__version__,
    }


def _parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rustdist.bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--world", type=_world_size, nargs="+", default=[2, 4],
                   help="world sizes to run (default: 2 4)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS),
                   help="collectives to run (default: all)")
    p.add_argument("--max-bytes", type=_parse_size, default=64 << 20,
                   help="largest size, e.g. 2M (default: 64MiB)")
    p.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    p.add_argument("--json", default="bench-results.json",
                   help="where to write all results (default: bench-results.json)")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the benchmark, prints the tables and a summary, writes the JSON file."""
    args = _parse_args(argv)
    sizes = tuple(s for s in SIZES if s <= args.max_bytes)
    if not sizes:
        sys.exit(f"--max-bytes must be at least {SIZES[0]}")
    cfg = Config(
        ops=tuple(args.ops),
        sizes=sizes,
        rounds=5 if args.quick else 15,
        round_seconds=0.01 if args.quick else 0.03,
        max_iters=2000,
    )
    machine = _machine()
    print(f"rustdist {machine['rustdist']} vs torch {machine['torch']} gloo | {machine['cpu']} | "
          f"{machine['usable_cores']}/{machine['cores']} cores | Python {machine['python']}")
    print(f"{cfg.rounds} alternating rounds of ~{cfg.round_seconds * 1e3:.0f} ms per side; "
          "latency = median over rounds of the slowest rank's mean per call")
    print("busbw as in nccl-tests (all_gather size = gathered tensor); "
          "speed-up = gloo us / rustdist us")
    start = time.perf_counter()
    rows: list[dict] = []
    for world in args.world:
        try:
            rows += _run_world(world, cfg)
        except RuntimeError as e:  # the ranks' own tracebacks are already on stderr
            sys.exit(f"bench failed: {e}")

    doors = [r for r in rows if r["op"] == "front_door"]
    rows = [r for r in rows if r["op"] != "front_door"]
    worst = min(rows, key=lambda r: r["speedup"])
    small = next((r for r in rows if r["world"] == 2 and r["op"] == "all_reduce"
                  and r["bytes"] == SIZES[0]), None)
    summary: dict[str, Any] = {
        "min_speedup": worst["speedup"],
        "min_speedup_at": {k: worst[k] for k in ("world", "op", "bytes")},
        "all_reduce_8B_world2_us": {s: small[f"{s}_us"] for s in SIDES} if small else None,
        "front_door_overhead_us": {r["world"]: r["overhead_us"] for r in doors},
        "seconds": time.perf_counter() - start,
    }
    line = (f"\nsummary: min speed-up {worst['speedup']:.2f}x (world {worst['world']} "
            f"{worst['op']} {_fmt_size(worst['bytes'])})")
    if small:
        line += (f"; 8 B all_reduce at world 2: rustdist {small['rustdist_us']:.1f} us, "
                 f"gloo {small['gloo_us']:.1f} us")
    print(f"{line}; {summary['seconds']:.0f} s")
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "config": asdict(cfg), "results": rows,
                   "front_door": doors, "summary": summary}, f, indent=1)
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
