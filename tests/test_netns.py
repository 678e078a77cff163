"""Test hosts made of network namespaces (rustdist._netns) and what runs on them: separate
hostnames and addresses, teardown (also on failure and after a killed run), link shaping, the
ranks of RUSTDIST_TEST_HOSTS worlds on their hosts, and interface selection
(RUSTDIST_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) on hosts with two interfaces.

Needs root and iproute2; without them every test here skips saying so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any, Callable, Iterator, Optional

import pytest

from harness import HOSTS_SPEC, World, parse_hosts_spec, placement, rustdist_only

from rustdist import _netns

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(_netns.unavailable_reason() is not None,
                       reason=f"test hosts unavailable: {_netns.unavailable_reason()}"),
]

SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print(socket.gethostname(), flush=True)
c, _ = s.accept()
n = 0
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    n += len(b)
c.sendall(str(n).encode())
"""

CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
data = b"x" * int(sys.argv[3])
t = time.monotonic()
c.sendall(data)
c.shutdown(socket.SHUT_WR)
got = int(c.recv(100))
print(socket.gethostname(), got, time.monotonic() - t)
"""


def transfer(hosts: _netns.Hosts, src: int, dst: int, nbytes: int, nic: int = 0) -> tuple[str, str, float]:
    """Sends `nbytes` from host `src` to host `dst` over NIC `nic`; returns both hostnames and
    the seconds the transfer took (until the receiver confirmed the count). The server prints
    its hostname once it listens, and only then does the client start."""
    addr, port = hosts.addr(dst, nic), 5000 + nic
    server = hosts.popen(dst, [sys.executable, "-c", SERVER, addr, str(port)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        dst_name = server.stdout.readline().strip()
        out = hosts.run(src, [sys.executable, "-c", CLIENT, addr, str(port), str(nbytes)],
                        capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        src_name, got, secs = out.stdout.split()
        assert int(got) == nbytes
        return src_name, dst_name, float(secs)
    finally:
        server.kill()
        server.wait()


def quickest(hosts: _netns.Hosts, src: int, dst: int, nbytes: int, tries: int = 3) -> float:
    """The fastest of `tries` transfers: an unshaped link's time, with the scheduling delays of a
    loaded machine (which only ever add time) mostly left out."""
    return min(transfer(hosts, src, dst, nbytes)[2] for _ in range(tries))


@pytest.fixture(scope="module")
def two_nics() -> Iterator[_netns.Hosts]:
    """Two hosts with eth0 (10.77.0.0/24) and eth1 (10.78.0.0/24) each."""
    with _netns.Hosts(2, nics=2) as hosts:
        yield hosts


def test_hosts_are_separate_machines(two_nics: _netns.Hosts) -> None:
    """Each host has its own hostname and addresses; host 1 reaches host 0 on both NICs; none
    of the addresses exists outside the namespaces."""
    for nic in (0, 1):
        src, dst, _ = transfer(two_nics, 1, 0, 1000, nic)
        assert (src, dst) == (two_nics.host(1).hostname, two_nics.host(0).hostname)
    assert two_nics.host(0).addrs == ("10.77.0.1", "10.78.0.1")
    root = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.77.0." not in root and "10.78.0." not in root, root


def test_teardown_on_failure_exit_and_after_a_killed_run(tmp_path: Any) -> None:
    """Namespaces go when the with-block fails, when a process exits without closing (atexit),
    and a killed run's are removed by the next Hosts()."""
    names: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        with _netns.Hosts(2) as hosts:
            names = [h.netns for h in hosts.hosts] + [hosts.switch]
            assert set(names) <= set(_netns.namespaces())
            raise RuntimeError("boom")
    assert not set(names) & set(_netns.namespaces())

    child = textwrap.dedent("""
        import os, sys
        from rustdist import _netns
        hosts = _netns.Hosts(2)
        print(hosts.tag, flush=True)
        if sys.argv[1] == "hang":
            sys.stdin.read()
    """)
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", child, "exit"], capture_output=True, text=True,
                         timeout=60, env=env)
    tag = out.stdout.strip()
    assert out.returncode == 0 and tag, out.stderr
    assert not [n for n in _netns.namespaces() if tag in n], "atexit tore the hosts down"

    killed = subprocess.Popen([sys.executable, "-c", child, "hang"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    assert killed.stdout is not None
    tag = killed.stdout.readline().strip()
    assert [n for n in _netns.namespaces() if tag in n]
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert [n for n in _netns.namespaces() if tag in n], "a killed run leaves its hosts"
    with _netns.Hosts(1):
        assert not [n for n in _netns.namespaces() if tag in n], "the next run reaps them"


def test_link_rate_is_shaped() -> None:
    """A 50 Mbit/s link moves 2.5 MB in no less than ~0.4 s; unshaped it is much faster."""
    with _netns.Hosts(2) as hosts:
        nbytes = 2_500_000
        fast = quickest(hosts, 1, 0, nbytes)
        hosts.shape(rate="50mbit", hosts=[1])
        _, _, slow = transfer(hosts, 1, 0, nbytes)
        assert slow >= 0.35, f"shaped transfer took {slow:.3f} s"
        assert fast < slow / 2, f"unshaped {fast:.3f} s vs shaped {slow:.3f} s"
        hosts.shape(hosts=[1])  # unshaped again
        again = quickest(hosts, 1, 0, nbytes)
        assert again < slow / 2, again


def test_link_delay() -> None:
    """A 20 ms delay on each host's egress makes a round trip take at least 40 ms, with a rate
    limit on top (netem, or where the kernel has none the delay line); undelaying some hosts
    leaves the others delayed, and closing the hosts stops the delay line. The delays are floors:
    a loaded machine can only add to them, so the test checks floors, and ceilings only on the
    quickest of a few tries."""
    with _netns.Hosts(3) as hosts:
        base = quickest(hosts, 1, 0, 10)
        assert base < 0.02, f"an unshaped round trip took {base:.3f} s"
        hosts.shape(delay_ms=20, rate="50mbit")
        _, _, delayed = transfer(hosts, 1, 0, 10)
        assert delayed >= 0.039, f"a round trip through two 20 ms delays took {delayed:.3f} s"
        _, _, slow = transfer(hosts, 1, 0, 2_500_000)
        assert slow >= 0.35, f"a 2.5 MB transfer at 50 Mbit/s took {slow:.3f} s"
        hosts.shape(hosts=[0, 1])
        undelayed = quickest(hosts, 1, 0, 10)
        _, _, one_way = transfer(hosts, 2, 0, 10)
        assert undelayed < 0.02, f"undelayed again, a round trip took {undelayed:.3f} s"
        assert one_way >= 0.018, f"host 2's data is still 20 ms late: {one_way:.3f} s"
        tag = hosts.tag
    assert not [cmd for cmd in command_lines() if "rustdist._delayline" in cmd and tag in cmd]


def test_delay_line_that_cannot_start_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delay line that cannot attach to its hosts fails shape() with what it printed."""
    if _netns.netem_available():
        pytest.skip("this kernel has netem: delays do not use the delay line")
    with _netns.Hosts(2) as hosts:
        monkeypatch.setattr(_netns, "NETNS_DIR", "/nonexistent")
        with pytest.raises(_netns.NetnsError, match="(?s)delay line of eth0.*No such file"):
            hosts.shape(delay_ms=1)


def command_lines() -> list[str]:
    """The command line of every process there is."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass  # gone meanwhile
    return found


def test_placement_fills_hosts_in_blocks() -> None:
    """RUSTDIST_TEST_HOSTS=HxR: worlds fill the hosts in blocks, rank 0 on host 0."""
    assert parse_hosts_spec("2x2") == (2, 2) and parse_hosts_spec("4x1") == (4, 1)
    with pytest.raises(ValueError, match="HxR"):
        parse_hosts_spec("2")
    assert placement(4, 2, 2) == [0, 0, 1, 1]
    assert placement(3, 2, 2) == [0, 0, 1]
    assert placement(2, 2, 2) == [0, 1]
    assert placement(4, 4, 1) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="does not fit"):
        placement(5, 2, 2)


@rustdist_only
@pytest.mark.skipif(not HOSTS_SPEC, reason="runs with RUSTDIST_TEST_HOSTS (./dev test does)")
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_run_on_their_hosts(worlds: Callable[[int], World], world: int) -> None:
    """Under RUSTDIST_TEST_HOSTS each rank is on its host: its hostname, MASTER_ADDR = host 0's
    address, and peer connections from its host's address; as many of them to each peer on
    another host as RUSTDIST_STREAMS_PER_PEER says (./dev test runs 4x1 with 3)."""
    streams = int(os.environ.get("RUSTDIST_STREAMS_PER_PEER", "1"))
    w = worlds(world)
    where = placement(world, *parse_hosts_spec(HOSTS_SPEC))
    got = w.run("net_cases:where")
    names = [g["hostname"] for g in got]
    for r, g in enumerate(got):
        assert g["master"] == "10.77.0.1", g
        same = [q for q in range(world) if where[q] == where[r]]
        assert [names[q] for q in same] == [names[r]] * len(same), names
        if len(same) < world:
            assert g["peer_ips"] == [f"10.77.0.{where[r] + 1}"], g
        assert g["streams"] == (streams if len(same) < world else 1), g
        assert g["connections"] == len(same) - 1 + (world - len(same)) * g["streams"], g
    assert len(set(names)) == len(set(where)), names


@pytest.fixture(scope="module")
def nic_world(two_nics: _netns.Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Two ranks, one on each of two_nics' hosts, not initialised."""
    w = World(2, init=False, hosts=two_nics, on_hosts=[0, 1],
              log_dir=str(tmp_path_factory.mktemp("nic-world")))
    yield w
    w.close()


VARS = ("RUSTDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@rustdist_only
@pytest.mark.parametrize("env,subnet", [
    ({}, "10.77.0."),  # no variable: the interface that routes to MASTER_ADDR (eth0)
    ({"RUSTDIST_SOCKET_IFNAME": "eth1"}, "10.78.0."),
    ({"RUSTDIST_SOCKET_IFNAME": "eth0"}, "10.77.0."),
    ({"GLOO_SOCKET_IFNAME": "=eth1"}, "10.78.0."),
    ({"RUSTDIST_SOCKET_IFNAME": "wlan,eth1"}, "10.78.0."),
    ({"RUSTDIST_SOCKET_IFNAME": "^eth0,lo"}, "10.78.0."),
    ({"RUSTDIST_SOCKET_IFNAME": "^=eth0"}, "10.78.0."),
    ({"RUSTDIST_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth0"}, "10.78.0."),
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "unset" if isinstance(v, dict) else v)
def test_socket_ifname_picks_the_interface(nic_world: World, env: dict[str, str], subnet: str) -> None:
    """The store stays on eth0 (MASTER_ADDR); the peers listen on, publish and connect over the
    interface the variable selects (NCCL_SOCKET_IFNAME's syntax)."""
    full: dict[str, Optional[str]] = {v: env.get(v) for v in VARS}
    results = nic_world.run("net_cases:init_with_env", env=full)
    for rank, res in enumerate(results):
        assert res["ok"], res.get("trace")
        assert res["peer_ips"] == [f"{subnet}{rank + 1}"], (rank, res)


@rustdist_only
def test_link_bandwidth_is_measured_between_hosts(nic_world: World) -> None:
    """A 200 Mbit/s link is timed at connect (every rank agrees, within the shaper's and the
    VM's slack); RUSTDIST_LINK_BANDWIDTH wins over the measurement."""
    unset: dict[str, Optional[str]] = {v: None for v in VARS}
    nic_world.hosts.shape(rate="200mbit", nic=0)
    try:
        shaped = nic_world.run("net_cases:init_with_env", env=unset)
        configured = nic_world.run("net_cases:init_with_env",
                                   env={**unset, "RUSTDIST_LINK_BANDWIDTH": "10gbit"})
    finally:
        nic_world.hosts.shape(nic=0)
    assert all(r["ok"] for r in shaped + configured), shaped + configured
    rates = [r["link_model"][1] for r in shaped]
    assert rates[0] == rates[1], rates
    assert 0.5 * 25e6 <= rates[0] <= 1.2 * 25e6, rates
    assert [r["link_model"][1] for r in configured] == [1_250_000_000] * 2, configured


@rustdist_only
def test_link_latency_is_measured_between_hosts(tmp_path: Any) -> None:
    """A link 2 ms away (one way) is timed at connect, the same on every rank, so selection
    sees a latency-bound link; RUSTDIST_LINK_LATENCY_US wins over the measurement."""
    unset: dict[str, Optional[str]] = {v: None for v in VARS}
    with _netns.Hosts(2) as hosts:
        hosts.shape(delay_ms=2)
        w = World(2, init=False, hosts=hosts, on_hosts=[0, 1], log_dir=str(tmp_path))
        try:
            measured = w.run("net_cases:init_with_env", env=unset)
            configured = w.run("net_cases:init_with_env",
                               env={**unset, "RUSTDIST_LINK_LATENCY_US": "300"})
        finally:
            w.close()
    assert all(r["ok"] for r in measured + configured), measured + configured
    latencies = [r["link_model"][0] for r in measured]
    assert latencies[0] == latencies[1], latencies
    assert 1.9e-3 <= latencies[0] <= 10e-3, latencies
    assert [r["link_model"][0] for r in configured] == [300e-6] * 2, configured


def _stream_window() -> int:
    """Bytes one TCP stream keeps in flight by rustdist's reckoning: half the smaller of the
    largest send and receive buffers (a new network namespace starts with this one's)."""
    def largest(name: str) -> int:
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            return int(f.read().split()[2])
    return min(largest("tcp_wmem"), largest("tcp_rmem")) // 2


@rustdist_only
def test_streams_per_peer_between_hosts(nic_world: World) -> None:
    """Peers on other hosts get RUSTDIST_STREAMS_PER_PEER TCP streams, one byte pipe striped
    across them (a 3 MiB all_reduce spans several stripes and must come out right); unset,
    one stream where it fills the link, and as many as keep the round trip in flight on a
    long fast one (here configured: 1 Gbit/s 20 ms away)."""
    unset: dict[str, Optional[str]] = {v: None for v in VARS}
    unset.update({"RUSTDIST_STREAMS_PER_PEER": None, "RUSTDIST_LINK_LATENCY_US": None,
                  "RUSTDIST_LINK_BANDWIDTH": None})
    forced = nic_world.run("net_cases:init_with_env",
                           env={**unset, "RUSTDIST_STREAMS_PER_PEER": "3"})
    default = nic_world.run("net_cases:init_with_env", env=unset)
    long_fat = nic_world.run("net_cases:init_with_env", env={
        **unset, "RUSTDIST_LINK_LATENCY_US": "20000", "RUSTDIST_LINK_BANDWIDTH": "1gbit"})
    assert all(r["ok"] for r in forced + default + long_fat), forced + default + long_fat
    # World 2: one peer, so the streams are the connections.
    assert [(r["streams"], r["connections"]) for r in forced] == [(3, 3)] * 2, forced
    assert [(r["streams"], r["connections"]) for r in default] == [(1, 1)] * 2, default
    in_flight = 2 * 20e-3 * 125e6
    want = min(8, max(1, -(-int(in_flight) // _stream_window())))
    assert want > 1, "this host's buffers would let one stream fill the link"
    assert [(r["streams"], r["connections"]) for r in long_fat] == [(want, want)] * 2, long_fat


@rustdist_only
@pytest.mark.parametrize("value", ["0", "17", "many"])
def test_streams_per_peer_out_of_range_names_the_variable(nic_world: World, value: str) -> None:
    """A value that is not auto or 1-16: every rank raises ValueError naming the variable and
    the value, before connecting."""
    env: dict[str, Optional[str]] = {v: None for v in VARS}
    env["RUSTDIST_STREAMS_PER_PEER"] = value
    for res in nic_world.run("net_cases:init_with_env", env=env, pg_timeout=10):
        assert not res["ok"] and res["type"] == "ValueError", res
        assert "RUSTDIST_STREAMS_PER_PEER" in res["msg"] and repr(value) in res["msg"].replace('"', "'"), res


@rustdist_only
@pytest.mark.parametrize("var", VARS)
def test_socket_ifname_without_match_names_the_interfaces(nic_world: World, var: str) -> None:
    """No interface matches: every rank raises ValueError naming the variable and listing the
    interfaces there are."""
    env: dict[str, Optional[str]] = {v: None for v in VARS}
    env[var] = "wlan"
    for rank, res in enumerate(nic_world.run("net_cases:init_with_env", env=env, pg_timeout=10)):
        assert not res["ok"] and res["type"] == "ValueError", res
        msg = res["msg"]
        assert f'{var}="wlan"' in msg and "matches no network interface" in msg, msg
        for nic in (0, 1):
            assert f"eth{nic} (10.{77 + nic}.0.{rank + 1})" in msg, msg
