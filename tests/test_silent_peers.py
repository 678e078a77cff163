"""Peers that go silent without closing their connections: a frozen (SIGSTOPped) rank and a
cut link between two test hosts. The heartbeat must name the silent rank and its host on every
other rank within 10 s (the defaults: a beat per second, failed after 5 missed), while the
group timeout is two minutes. Ranks run on network-namespace hosts (root and iproute2; skipped
saying so elsewhere), so the link can be cut under them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from harness import reaped

from rustdist import _netns

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(_netns.unavailable_reason() is not None,
                       reason=f"test hosts unavailable: {_netns.unavailable_reason()}"),
]

# A rank: joins, proves the group works, says "ready", waits for "go", then blocks in a
# barrier and reports how it ended (with the monotonic time, shared by every namespace).
RANK = """
import sys, time
from datetime import timedelta
import numpy as np
import rustdist as dist
rank, world, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=120))
x = np.ones(3, np.float32)
dist.all_reduce(x)
assert x.tolist() == [world] * 3, x
print("ready", flush=True)
sys.stdin.readline()
try:
    dist.barrier()
    print("passed", flush=True)
except Exception as e:
    print(f"failed {time.monotonic():.3f} {type(e).__name__}: {e}", flush=True)
"""

PORT = 29531


def start(hosts: _netns.Hosts, per_host: int, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """The ranks of a world of ``len(hosts) * per_host``, host by host, all past "ready".
    MASTER_ADDR tells the ranks which interface reaches the others (the one routing there)."""
    world = len(hosts) * per_host
    procs = [
        hosts.popen(r // per_host,
                    [sys.executable, "-c", RANK, str(r), str(world), hosts.addr(0), str(PORT)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, env={**env, "MASTER_ADDR": hosts.addr(0)})
        for r in range(world)
    ]
    for r, p in enumerate(procs):
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        assert line == "ready", f"rank {r}: {line!r} {p.stderr.read() if p.poll() is not None and p.stderr else ''}"
    return procs


def go(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


def outcome(p: subprocess.Popen[str]) -> tuple[float, str]:
    """When and how a rank's barrier failed."""
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    m = re.match(r"failed (\S+) (.*)", line)
    assert m, f"expected a failure, got {line!r}"
    return float(m.group(1)), m.group(2)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    with reaped() as tag:
        yield {**os.environ, **tag, "RUSTDIST_LOG_LEVEL": "off"}


def test_a_frozen_rank_is_named_on_every_other_rank_within_10s(env: dict[str, str]) -> None:
    with _netns.Hosts(2) as hosts:
        procs = start(hosts, 2, env)
        frozen = 3
        procs[frozen].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        go(procs[:frozen])
        for r, p in enumerate(procs[:frozen]):
            at, msg = outcome(p)
            assert at - stopped < 10, f"rank {r} took {at - stopped:.1f} s"
            assert msg.startswith("DistNetworkError"), msg
            assert f"rank {frozen} (host {hosts.addr(1)}) has been silent" in msg, msg
        procs[frozen].kill()


def test_a_cut_link_is_named_on_both_sides_within_10s(env: dict[str, str]) -> None:
    with _netns.Hosts(2) as hosts:
        procs = start(hosts, 2, env)
        # Host 1's cable out of the switch: no FIN, no RST, nothing.
        subprocess.run(["ip", "-n", hosts.switch, "link", "set", "h1n0", "down"], check=True)
        cut = time.monotonic()
        go(procs)
        for r, p in enumerate(procs):
            at, msg = outcome(p)
            assert at - cut < 10, f"rank {r} took {at - cut:.1f} s"
            assert msg.startswith("DistNetworkError"), msg
            other = 2 if r < 2 else 0  # the lowest rank of the other host
            silent = re.search(r"rank (\d) \(host (\S+)\) has been silent", msg)
            assert silent, msg
            assert int(silent.group(1)) // 2 == other // 2, msg
            assert silent.group(2) == hosts.addr(other // 2), msg


def test_heartbeat_and_link_settings_are_checked(env: dict[str, str]) -> None:
    """A bad heartbeat or link-model setting is refused at init, naming the variable."""
    prog = ("import rustdist as dist\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29533', rank=0, "
            "world_size=1)\n")
    for var, value in [("RUSTDIST_HEARTBEAT_INTERVAL", "soon"), ("RUSTDIST_HEARTBEAT_MISSES", "0"),
                       ("RUSTDIST_LINK_BANDWIDTH", "fast"), ("RUSTDIST_LINK_LATENCY_US", "-3")]:
        out = subprocess.run([sys.executable, "-c", prog], env={**env, var: value},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and f"ValueError: {var}" in out.stderr, out.stderr[-2000:]
