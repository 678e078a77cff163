"""One rank of tests/test_aarch64.py's world: an aarch64 Python (under qemu-user) that imports
the aarch64 wheel and runs collectives on numpy arrays, checking every element.

Started with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment (env://), and
RUSTDIST_SHM=0 for the TCP run. Needs only numpy and rustdist: torch is not installed there.
The last line it prints is ``RESULT {json}``: the machine, the checks that passed, and the
algorithms rustdist ran (``rustdist.stats()``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import timedelta
from typing import Any

import numpy as np

import rustdist as dist

#: float16 SUM goes through the f16 conversion kernels; bfloat16 has no numpy dtype.
SUM_DTYPES = ("float32", "float64", "float16", "int64", "int32", "uint8")
#: Elements: one inline in a flag entry, one a slot piece, one past a slot (1 MiB) and a ring
#: (1 MiB), not a multiple of 8 (the vector loops' tails).
SIZES = (7, 1000, 300_001)
#: Process-group timeout: a hung collective fails the rank well before the driver gives up.
PG_TIMEOUT_S = 60.0


def data(dtype: str, n: int, rank: int, seed: int) -> np.ndarray:
    """Rank `rank`'s deterministic input: finite floats of every magnitude (float16: every
    finite bit pattern may come, subnormals included), integers across their range."""
    rng = np.random.default_rng([seed, rank, n])
    dt = np.dtype(dtype)
    if dt == np.float16:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf or NaN: a large finite instead
        return bits.view(np.float16)
    if dt.kind == "f":
        return (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(dt)
    info = np.iinfo(dt)
    # Half the range, so that sums of two stay in range for the signed types.
    return rng.integers(info.min // 2, info.max // 2, n, dtype=dt, endpoint=True)


def summed(xs: list[np.ndarray]) -> np.ndarray:
    """The sum rustdist computes: float16 widened to float32, added, rounded once."""
    if xs[0].dtype == np.float16:
        return np.asarray(sum(x.astype(np.float32) for x in xs)).astype(np.float16)
    return np.asarray(np.sum(xs, axis=0, dtype=xs[0].dtype))


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Element by element, bit for bit."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}")
    differ = (got.view(np.uint8).reshape(got.size, -1)
              != want.view(np.uint8).reshape(want.size, -1)).any(axis=1)
    bad = np.flatnonzero(differ)
    if len(bad):
        i = bad[0]
        raise AssertionError(f"{what}: {len(bad)} of {got.size} elements differ, the first "
                             f"at {i}: got {got[i]!r}, want {want[i]!r}")


def run(rank: int, world: int) -> dict[str, Any]:
    """The collectives, each checked against a reference computed here from every rank's
    input; returns how many checks passed."""
    checked = 0
    peer = 1 - rank  # world 2
    for seed, n in enumerate(SIZES):
        for dtype in SUM_DTYPES:
            xs = [data(dtype, n, r, seed) for r in range(world)]
            a = xs[rank].copy()
            with np.errstate(over="ignore"):
                dist.all_reduce(a)
                want = summed(xs)
            check(a, want, f"all_reduce SUM {dtype}[{n}]")
            checked += 1
        xs = [data("float32", n, r, seed + 10) for r in range(world)]
        a = xs[rank].copy()
        dist.all_reduce(a, op=dist.ReduceOp.MAX)
        check(a, np.maximum.reduce(xs), f"all_reduce MAX float32[{n}]")
        checked += 1
        for dtype in ("float32", "float16", "int64"):
            xs = [data(dtype, n, r, seed + 20) for r in range(world)]
            outs = [np.zeros(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, xs[rank])
            for r in range(world):
                check(outs[r], xs[r], f"all_gather {dtype}[{n}] block {r}")
            flat = np.zeros(world * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, xs[rank])
            check(flat, np.concatenate(xs), f"all_gather_into_tensor {dtype}[{n}]")
            for src in range(world):
                b = xs[rank].copy()
                dist.broadcast(b, src=src)
                check(b, xs[src], f"broadcast {dtype}[{n}] from {src}")
            checked += 2 + world
        for dtype in ("float64", "int32"):
            # Rank 0 sends first and then receives; rank 1 the other way round.
            mine, theirs = data(dtype, n, rank, seed + 30), data(dtype, n, peer, seed + 30)
            got = np.zeros(n, dtype=dtype)
            if rank == 0:
                dist.send(mine, dst=peer)
                dist.recv(got, src=peer)
            else:
                dist.recv(got, src=peer)
                dist.send(mine, dst=peer)
            check(got, theirs, f"send/recv {dtype}[{n}] from {peer}")
            checked += 1
    dist.barrier()
    return {"checked": checked, "algorithms": dist.stats()["algorithms"]}


def main() -> None:
    machine = platform.machine()
    assert machine == "aarch64", f"this rank runs on {machine}, not aarch64"
    assert "torch" not in sys.modules
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend="rustdist", init_method="env://", rank=rank,
                            world_size=world, timeout=timedelta(seconds=PG_TIMEOUT_S))
    result = run(rank, world)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "machine": machine, **result}), flush=True)


if __name__ == "__main__":
    main()
