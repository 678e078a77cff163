"""TLS against plain TCP between test hosts (issue 38), in one session, alternating runs.

Each run starts WORLD ranks, one per test host (``rustdist._netns``, root needed), with TLS
off, with certificate files or with pinned keys, and times on the shaped links:

- a 64 MiB all_reduce and an all_gather of 64 MiB in all (busbw, GB/s; the median of
  ``--iters``);
- an 8-byte all_reduce (microseconds: the median of 5 blocks of 100 back to back);
- the ranks' CPU seconds (user + system) over the large operations, per GiB each rank sent.

Usage (from the repository root, rustdist importable)::

    python tools/tls_bench.py --link 1gbit --delay 0.5 --rounds 3 --json docs/bench/tls-1gbit.json

The machine's cores are shared by every rank and the delay line: say so with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

RANK = r"""
import json, os, resource, sys, time
from datetime import timedelta
import torch
import rustdist as dist

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

iters = int(sys.argv[1])
dist.init_process_group("rustdist", init_method="env://", timeout=timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
big = torch.ones((64 << 20) // 4)
part = torch.ones((64 << 20) // 4 // world)
out = torch.empty(part.numel() * world)
small = torch.ones(2)
def timed(fn, n):
    ts = []
    for _ in range(n):
        dist.barrier()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts
timed(lambda: dist.all_reduce(big), 1)
timed(lambda: dist.all_gather_into_tensor(out, part), 1)
c0 = cpu()
ar = timed(lambda: dist.all_reduce(big), iters)
ag = timed(lambda: dist.all_gather_into_tensor(out, part), iters)
c1 = cpu()
def back_to_back(n):
    t = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(small)
    return (time.perf_counter() - t) / n
back_to_back(50)
lat = [back_to_back(100) for _ in range(5)]
# Bytes each rank sends: a ring all_reduce 2(n-1)/n of the buffer, an all_gather (n-1) parts.
sent = iters * ((2 * (world - 1) / world) * (64 << 20) + (world - 1) * part.numel() * 4)
print(json.dumps({"rank": rank, "all_reduce": ar, "all_gather": ag, "small": lat,
                  "cpu_s": c1 - c0, "sent_bytes": sent}), flush=True)
dist.destroy_process_group()
"""


def modes(pki: str) -> dict[str, dict[str, str]]:
    """Each mode's environment (the rest of TLS's variables unset)."""
    key = {"RUSTDIST_AUTH_KEY": "tls bench"}
    return {
        "plain": dict(key),
        "certs": {**key, "RUSTDIST_TLS_CERT": f"{pki}/h.pem", "RUSTDIST_TLS_KEY": f"{pki}/h.key",
                  "RUSTDIST_TLS_CA": f"{pki}/ca.pem"},
        "pinned": {**key, "RUSTDIST_TLS": "1"},
    }


def run(hosts: Any, world: int, env: dict[str, str], iters: int, port: int) -> list[dict[str, Any]]:
    """One world with `env`: every rank's figures."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RUSTDIST_TLS", "GLOO_"))}
    procs = []
    for r in range(world):
        e = {**base, **env, "MASTER_ADDR": hosts.addr(0), "MASTER_PORT": str(port),
             "RANK": str(r), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}
        procs.append(hosts.popen(r, [sys.executable, "-c", RANK, str(iters)], env=e,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed:\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def summary(ranks: list[dict[str, Any]], world: int) -> dict[str, float]:
    """Busbw of the large operations (the slowest rank's median time), the small one's median
    latency and the CPU seconds per GiB sent (mean over ranks)."""
    size = 64 << 20
    ar = max(statistics.median(r["all_reduce"]) for r in ranks)
    ag = max(statistics.median(r["all_gather"]) for r in ranks)
    return {
        "all_reduce_busbw": size * 2 * (world - 1) / world / ar / 1e9,
        "all_gather_busbw": size * (world - 1) / world / ag / 1e9,
        "small_us": max(statistics.median(r["small"]) for r in ranks) * 1e6,
        "cpu_s_per_gib": statistics.mean(r["cpu_s"] / (r["sent_bytes"] / 2**30) for r in ranks),
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--link", required=True, help="tc rate of every host's sends, e.g. 1gbit")
    p.add_argument("--delay", type=float, default=0.0, help="one-way delay, ms")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="runs of each mode, alternating")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--modes", nargs="+", default=["plain", "certs", "pinned"])
    p.add_argument("--json", help="write every run's figures there")
    args = p.parse_args(argv)
    from rustdist import _netns

    # The tests' PKI maker (tests/tls_pki.py).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tls_pki import write_test_pki

    pki = tempfile.TemporaryDirectory(prefix="rustdist-tls-bench-")
    write_test_pki(Path(pki.name), ["h"])
    env_of = modes(pki.name)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    with pki, _netns.Hosts(args.world) as hosts:
        hosts.shape(rate=args.link, delay_ms=args.delay)
        port = 29600
        for rnd in range(args.rounds):
            for mode in args.modes:
                port += 1
                got = summary(run(hosts, args.world, env_of[mode], args.iters, port), args.world)
                runs[mode].append(got)
                print(f"round {rnd} {mode}: " + ", ".join(f"{k} {v:.4g}" for k, v in got.items()),
                      flush=True)
    table = {}
    for mode in args.modes:
        table[mode] = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
        table[mode].update({f"{k}_min": min(r[k] for r in runs[mode]) for k in runs[mode][0]})
        table[mode].update({f"{k}_max": max(r[k] for r in runs[mode]) for k in runs[mode][0]})
    for mode in args.modes:
        if mode == "plain" or "plain" not in table:
            continue
        ratios = {k: table[mode][k] / table["plain"][k] for k in
                  ("all_reduce_busbw", "all_gather_busbw", "small_us")}
        print(f"{mode} / plain: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "link": args.link, "delay_ms": args.delay,
                       "world": args.world, "machine": {"cpus": os.cpu_count(),
                                                        "python": platform.python_version()},
                       "when": time.strftime("%Y-%m-%d %H:%M"), "runs": runs, "medians": table},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
