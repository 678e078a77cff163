"""Silent peers in worlds larger than a ring's neighbourhood: each rank watches only its two
ring neighbours, so most ranks learn of a frozen (SIGSTOPped) rank from the failure spread
along the ring's fingers. Every survivor must still name the frozen rank, with a
DistNetworkError, within 10 s (a beat a second, failed after 5 missed), and a timeout must still
name the rank that never arrived however far along the ring it is. Ranks are numpy-only
processes on 127.0.0.1 over TCP (no torch: about 35 MB each)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from harness import no_torch_prelude, reaped
from test_silent_peers import go, outcome

from rustdist.bench.launch import free_port

pytestmark = pytest.mark.timeout(180)

# A rank without torch: joins, proves the group works, says "ready", waits for "go", then blocks in a
# barrier and reports how it ended, with the monotonic time (shared by every process).
RANK = no_torch_prelude() + """
import sys, time
from datetime import timedelta
import numpy as np
import rustdist as dist
rank, world, port, timeout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=timeout))
x = np.ones(3, np.float32)
dist.all_reduce(x)
assert x.tolist() == [world] * 3, x
assert "torch" not in sys.modules
print("ready", flush=True)
sys.stdin.readline()
try:
    dist.barrier()
    print("passed", flush=True)
except Exception as e:
    print(f"failed {time.monotonic():.3f} {type(e).__name__}: {e}", flush=True)
"""


def start(world: int, env: dict[str, str], timeout: float) -> list[subprocess.Popen[str]]:
    """The ranks of a world, all past "ready"."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(world), str(port),
                               str(timeout)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    for r, p in enumerate(procs):
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        assert line == "ready", f"rank {r}: {line!r}"
    return procs


#: More worlds for this test, e.g. "256" (docs/scale.md, "A frozen rank at 256"); ulimit -n must
#: cover them.
EXTRA_WORLDS = [int(w) for w in os.environ.get("RUSTDIST_TEST_FROZEN_WORLDS", "").split()]


@pytest.mark.parametrize("world", [8, 24, *EXTRA_WORLDS])
def test_a_frozen_rank_is_named_on_every_survivor_within_10s(world: int) -> None:
    with reaped() as tag:
        env = {**os.environ, **tag, "RUSTDIST_SHM": "0", "RUSTDIST_LOG_LEVEL": "off"}
        procs = start(world, env, timeout=120)
        frozen = world // 2 + 1
        procs[frozen].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        survivors = [r for r in range(world) if r != frozen]
        go([procs[r] for r in survivors])
        slowest = 0.0
        for r in survivors:
            at, msg = outcome(procs[r])
            assert at - stopped < 10, f"rank {r} took {at - stopped:.1f} s: {msg}"
            assert msg.startswith("DistNetworkError"), msg
            assert f"rank {frozen} (host 127.0.0.1) has been silent" in msg, msg
            slowest = max(slowest, at - stopped)
        procs[frozen].kill()
        print(f"world {world}: {len(survivors)} survivors named frozen rank {frozen}, "
              f"the slowest {slowest:.2f} s after the freeze")


def test_a_timeout_names_a_far_rank_that_never_arrived() -> None:
    """With heartbeats off the ring (every rank alive, one busy elsewhere), the timeout asks
    every peer what it is doing: rank 0 names the rank that never entered the barrier, though
    it is no neighbour of rank 0's."""
    world, late = 8, 4
    with reaped() as tag:
        env = {**os.environ, **tag, "RUSTDIST_SHM": "0", "RUSTDIST_LOG_LEVEL": "off"}
        procs = start(world, env, timeout=5)
        go([p for r, p in enumerate(procs) if r != late])
        _, msg = outcome(procs[0])
        assert re.search(rf"Timed out waiting for rank\(s\) {late}\b", msg), msg
        assert f"rank {late} has not entered barrier" in msg, msg
        for p in procs:
            p.kill()
