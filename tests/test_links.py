"""Links on demand: a rank connects at init only to its two ring neighbours (and the peers it
shares memory with) and to every other peer on first use, so its sockets grow with the peers
it talks to; RUSTDIST_EAGER_CONNECT=1 links every peer at init instead. Ranks are numpy-only
processes on 127.0.0.1 over TCP (no torch), each counting its own sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import no_torch_prelude, reaped

from rustdist.bench.launch import free_port

pytestmark = pytest.mark.timeout(120)

# A rank without torch: counts its sockets after init, after an 8-byte all_reduce at world 6
# (recursive doubling: partners 1, 2 and 4 away, by xor) and after an all_to_all (every peer),
# checking each result; prints the counts as JSON.
RANK = no_torch_prelude() + """
import json, os, sys
import numpy as np
import rustdist as dist
rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:  # the listing's own fd is gone by now
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass
    return n

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
counts = {"init": sockets()}
# No rank starts an operation (and dials) before every rank has counted: the count waits in
# the job's store, on a client that is gone before the next count.
store = dist.TCPStore("127.0.0.1", int(port), world, False)
if store.add("links/counted", 1) == world:
    store.set("links/all counted", b"1")
store.wait(["links/all counted"])
del store
x = np.full(2, rank, np.int64)
dist.all_reduce(x)
assert x.tolist() == [sum(range(world))] * 2, x
counts["all_reduce"] = sockets()
out = np.zeros(world, np.int64)
dist.all_to_all_single(out, np.arange(world, dtype=np.int64) + 100 * rank)
assert out.tolist() == [100 * r + rank for r in range(world)], out
counts["all_to_all"] = sockets()
dist.barrier()
print(json.dumps(counts), flush=True)
dist.destroy_process_group()
"""


def sockets_per_rank(world: int, eager: bool) -> list[dict[str, int]]:
    """Each rank's socket counts at each point, from a world of numpy ranks."""
    port = free_port()
    with reaped() as tag:
        env = {**os.environ, **tag, "RUSTDIST_SHM": "0", "RUSTDIST_LOG_LEVEL": "off",
               "RUSTDIST_EAGER_CONNECT": "1" if eager else "0"}
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env)
                 for r in range(world)]
        results = []
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, f"rank {r} failed:\n{err}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_a_rank_links_the_peers_it_uses_when_it_first_uses_them() -> None:
    """World 6: after init a rank holds 2 links (its ring neighbours); an 8-byte all_reduce
    adds only the partners recursive doubling needs; after an all_to_all it holds all 5,
    as many as a rank linked eagerly holds from the start. Rank 0 also serves the store (a
    socket per client), so ranks 1-5 are checked."""
    world = 6
    counts = sockets_per_rank(world, eager=False)
    for r in range(1, world):
        c = counts[r]
        assert c["all_to_all"] - c["init"] == world - 1 - 2, (r, c)
        assert c["init"] <= c["all_reduce"] <= c["all_to_all"], (r, c)


def test_eager_connect_links_every_peer_at_init() -> None:
    """RUSTDIST_EAGER_CONNECT=1: every peer is linked at init; no operation adds a socket, and
    a rank holds as many links from the start as one linked on demand holds once it has used
    every peer."""
    world = 6
    counts = sockets_per_rank(world, eager=True)
    for r in range(1, world):
        c = counts[r]
        assert c["init"] == c["all_reduce"] == c["all_to_all"], (r, c)
    lazy = sockets_per_rank(world, eager=False)
    for r in range(1, world):
        # Linked on demand, a rank keeps its listener; linked eagerly, it closes it after init.
        assert counts[r]["init"] - lazy[r]["init"] == world - 1 - 2 - 1, (r, counts[r], lazy[r])
        assert lazy[r]["all_to_all"] == counts[r]["all_to_all"] + 1, (r, counts[r], lazy[r])
