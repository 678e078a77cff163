"""Test hosts made of Linux network namespaces, for running ranks "on different machines".

Each host is a network namespace with its own interfaces ``eth0``, ``eth1``, ... (NIC *k* on
the subnet ``10.(77+k).0.0/24``, host *i* at ``.i+1``), each a veth whose other end sits on
bridge ``br<k>`` of a switch namespace. Addresses exist only inside those namespaces. A process
placed on a host also gets a UTS namespace with the host's own hostname: ranks on different
hosts then look remote to each other (rustdist decides that two ranks share memory from the
hostname and boot id), while ranks on the same host share memory as on a real machine.

Links can be shaped with ``tc``: a rate limit (``tbf``), and a one-way delay with ``netem``
where the kernel has it (``CONFIG_NET_SCH_NETEM``; :func:`netem_available` says). Where it does
not, a delayed NIC becomes a TUN device on every host, joined by a delay line in user space
(:mod:`rustdist._delayline`) instead of the bridge.

Usage (root and iproute2 needed; :func:`unavailable_reason` says why not, for a skip)::

    from rustdist import _netns

    with _netns.Hosts(2, nics=2) as hosts:       # 2 hosts, eth0 10.77.0.x and eth1 10.78.0.x
        hosts.shape(rate="1gbit")                # every host's eth0 sends at 1 Gbit/s
        hosts.run(1, ["python", "-c", "..."])    # a command on host 1
        # in a freshly forked, single-threaded child, before any socket:
        _netns.enter(hosts.host(0))              # this process is now on host 0

Everything is torn down by ``close()`` / leaving the ``with`` block, and at interpreter exit
(``atexit``). Names carry the creating process id and a random tag, so runs never collide; the
namespaces of runs that were killed (their process is gone) are removed when the next
``Hosts`` is created, or with ``python -m rustdist._netns cleanup``.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ._delayline import TUN_DEVICE

#: Every namespace this module creates is named ``rustdist-<pid>-<tag>-...``.
PREFIX = "rustdist-"
NETNS_DIR = "/run/netns"
#: NIC k of every host is on 10.(FIRST_SUBNET + k).0.0/24.
FIRST_SUBNET = 77
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
#: The MTU of a NIC on the delay line: TCP then moves 64 KiB segments, as over a veth with
#: segmentation offload, and the line forwards few packets per byte.
TUN_MTU = 65000
#: Seconds to wait for a delay line to attach to its hosts.
LINE_START_TIMEOUT = 10.0


class NetnsError(RuntimeError):
    """Creating, shaping or entering the test hosts failed (the message says how)."""


@dataclass(frozen=True)
class Host:
    """One test host: what a process needs to move onto it (picklable)."""

    index: int
    netns: str
    hostname: str
    #: The address of each NIC: ``addrs[k]`` is ``eth<k>``'s.
    addrs: tuple[str, ...]

    @property
    def addr(self) -> str:
        """The address of ``eth0``."""
        return self.addrs[0]


def _run(argv: Sequence[str], stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Runs an iproute2 command; raises NetnsError with its stderr when it fails."""
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        what = " ".join(argv) + (f" <<{stdin.strip()!r}" if stdin else "")
        raise NetnsError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


_reason_cache: list[Optional[str]] = []


def unavailable_reason() -> Optional[str]:
    """Why test hosts cannot be made here (for a test skip), or None when they can."""
    if not _reason_cache:
        _reason_cache.append(_probe())
    return _reason_cache[0]


def _probe() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"iproute2 is not installed ({tool!r} not found; apt-get install iproute2)"
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        _run(["ip", "netns", "add", name])
        _run(["ip", "netns", "del", name])
    except NetnsError as e:
        return f"cannot create a network namespace here: {e}"
    return None


_netem_cache: list[bool] = []


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (link delay); probed once, in a scratch namespace."""
    if not _netem_cache:
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}-netem"
        try:
            _run(["ip", "netns", "add", name])
        except NetnsError:
            _netem_cache.append(False)
            return False
        try:
            _run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
            _netem_cache.append(True)
        except NetnsError:
            _netem_cache.append(False)
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return _netem_cache[0]


def _rate_bits(rate: str) -> float:
    """A tc rate ("1gbit", "10gbit", "500mbit", "100kbit") in bits per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected a number with kbit, mbit or gbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def namespaces() -> list[str]:
    """The network namespaces that exist (by name)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def _owner_alive(name: str) -> bool:
    m = re.match(rf"{re.escape(PREFIX)}(\d+)-", name)
    if not m:
        return True
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> list[str]:
    """Deletes the namespaces of runs whose process is gone (a killed test run); returns them."""
    stale = [n for n in namespaces() if n.startswith(PREFIX) and not _owner_alive(n)]
    for name in stale:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return stale


_live: dict[int, "Hosts"] = {}


def _close_all() -> None:
    for hosts in list(_live.values()):
        hosts.close()


atexit.register(_close_all)


class Hosts:
    """``n`` test hosts with ``nics`` interfaces each, on one switch per NIC. Use as a context
    manager (or call :meth:`close`); the hosts are also torn down at interpreter exit."""

    def __init__(self, n: int, nics: int = 1) -> None:
        if n < 1 or not 1 <= nics <= 8:
            raise ValueError(f"Hosts(n={n}, nics={nics}): need n >= 1 and 1 <= nics <= 8")
        reason = unavailable_reason()
        if reason:
            raise NetnsError(reason)
        reap_stale()
        self.tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.nics = nics
        self.switch = f"{PREFIX}{self.tag}-sw"
        self.hosts = [
            Host(i, f"{PREFIX}{self.tag}-h{i}", f"rdhost{i}-{self.tag}",
                 tuple(f"10.{FIRST_SUBNET + k}.0.{i + 1}" for k in range(nics)))
            for i in range(n)
        ]
        self._created: list[str] = []
        #: NIC -> every host's one-way delay in seconds, for NICs on a delay line.
        self._delays: dict[int, list[float]] = {}
        self._lines: dict[int, subprocess.Popen[str]] = {}
        _live[id(self)] = self
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for name in [self.switch] + [h.netns for h in self.hosts]:
            _run(["ip", "netns", "add", name])
            self._created.append(name)
        switch = [f"link add br{k} type bridge" for k in range(self.nics)]
        switch += [f"link set br{k} up" for k in range(self.nics)]
        for h in self.hosts:
            for k in range(self.nics):
                port = f"h{h.index}n{k}"
                switch.append(f"link add {port} type veth peer name eth{k} netns {h.netns}")
                switch.append(f"link set {port} master br{k} up")
        _run(["ip", "-n", self.switch, "-batch", "-"], "\n".join(switch) + "\n")
        for h in self.hosts:
            cmds = ["link set lo up"]
            for k, addr in enumerate(h.addrs):
                cmds += [f"addr add {addr}/24 dev eth{k}", f"link set eth{k} up"]
            _run(["ip", "-n", h.netns, "-batch", "-"], "\n".join(cmds) + "\n")

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.hosts)

    def host(self, i: int) -> Host:
        """Host ``i``."""
        return self.hosts[i]

    def addr(self, i: int, nic: int = 0) -> str:
        """The address of host ``i``'s NIC ``nic``."""
        return self.hosts[i].addrs[nic]

    def shape(self, rate: Optional[str] = None, delay_ms: float = 0.0,
              hosts: Optional[Sequence[int]] = None, nic: int = 0) -> None:
        """Shapes what each host in ``hosts`` (default all) sends on NIC ``nic``: at most
        ``rate`` (tc syntax, e.g. ``"1gbit"``, ``"10gbit"``) and ``delay_ms`` later. Traffic
        between two hosts passes one sender's egress per direction, so the round trip gains
        ``2 * delay_ms``. Nothing given: unshaped. The delay is netem's where the kernel has
        it; elsewhere the first delay on a NIC moves that NIC of every host onto a delay line
        (connections open across it break: shape before starting the ranks).
        """
        targets = range(len(self.hosts)) if hosts is None else hosts
        on_line = nic in self._delays or (delay_ms > 0 and not netem_available())
        if on_line:
            if nic not in self._delays:
                self._onto_line(nic)
            for i in targets:
                self._delays[nic][i] = delay_ms / 1000
            self._start_line(nic)
        for i in targets:
            ns, dev = self.hosts[i].netns, f"eth{nic}"
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)
            if delay_ms > 0 and not on_line:
                qdisc = ["netem", "delay", f"{delay_ms}ms", "limit", "100000"]
                if rate:
                    qdisc += ["rate", rate]
            elif rate:
                # A bucket of 1 ms worth of bytes (at least 64 KiB, for GSO segments).
                burst = max(int(_rate_bits(rate) / 8 / 1000), 64 << 10)
                qdisc = ["tbf", "rate", rate, "burst", str(burst), "latency", "20ms"]
            else:
                continue
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *qdisc])

    def _onto_line(self, nic: int) -> None:
        """Replaces NIC ``nic`` of every host (a veth to the bridge) by a TUN device with the
        same name and address, for a delay line to join."""
        if not os.path.exists(TUN_DEVICE):
            # Some containers have the tun driver but no device node for it.
            os.makedirs(os.path.dirname(TUN_DEVICE), exist_ok=True)
            os.mknod(TUN_DEVICE, stat.S_IFCHR | 0o600, os.makedev(10, 200))
        for h in self.hosts:
            dev = f"eth{nic}"
            cmds = [f"link del {dev}", f"tuntap add dev {dev} mode tun",
                    f"link set {dev} mtu {TUN_MTU} txqueuelen 10000 up",
                    f"addr add {h.addrs[nic]}/24 dev {dev}"]
            _run(["ip", "-n", h.netns, "-batch", "-"], "\n".join(cmds) + "\n")
        self._delays[nic] = [0.0] * len(self.hosts)

    def _start_line(self, nic: int) -> None:
        """(Re)starts the delay line of NIC ``nic`` with the hosts' current delays."""
        self._stop_line(nic)
        config = [[os.path.join(NETNS_DIR, h.netns), f"eth{nic}", h.addrs[nic], delay]
                  for h, delay in zip(self.hosts, self._delays[nic])]
        line = subprocess.Popen([sys.executable, "-m", "rustdist._delayline", json.dumps(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines[nic] = line
        assert line.stdout is not None
        ready, _, _ = select.select([line.stdout], [], [], LINE_START_TIMEOUT)
        if not ready or line.stdout.readline().strip() != "ready":
            del self._lines[nic]
            line.kill()
            _, err = line.communicate()
            raise NetnsError(f"the delay line of eth{nic} did not say it was ready within "
                             f"{LINE_START_TIMEOUT:.0f} s; it printed: {err.strip()}")

    def _stop_line(self, nic: int) -> None:
        line = self._lines.pop(nic, None)
        if line is not None:
            line.kill()
            line.wait()
            for stream in (line.stdout, line.stderr):
                if stream is not None:
                    stream.close()

    def alter_next_segment(self, nic: int = 0) -> None:
        """Has the delay line of NIC ``nic`` (running since a delay was set there) flip one bit
        of the next TCP segment with data it forwards, as a host on the path could."""
        line = self._lines.get(nic)
        if line is None:
            raise NetnsError(f"eth{nic} is on no delay line: shape it with a delay first")
        line.send_signal(signal.SIGUSR1)

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command line that runs on host ``i`` (its network namespace, and a
        UTS namespace with its hostname)."""
        h = self.hosts[i]
        return ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "sh", "-c",
                'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', h.hostname, *argv]

    def run(self, i: int, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` on host ``i``."""
        return subprocess.run(self.command(i, argv), **kw)

    def popen(self, i: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` of ``argv`` on host ``i``."""
        return subprocess.Popen(self.command(i, argv), **kw)

    def close(self) -> None:
        """Deletes every namespace of these hosts (idempotent). Processes still on a host keep
        its namespace alive until they exit; its name is gone at once."""
        for nic in list(self._lines):
            self._stop_line(nic)
        for name in reversed(self._created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._created = []
        _live.pop(id(self), None)


def _libc_call(fn: Any, *args: Any) -> None:
    if fn(*args) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"{fn.__name__}: {os.strerror(err)} ({errno.errorcode.get(err, err)})")


def enter(host: Host) -> None:
    """Moves the calling process onto ``host``: into its network namespace, and into a UTS
    namespace of its own with the host's hostname. Call it while the process is single-threaded
    (threads started later inherit both), before it opens any socket."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        fd = os.open(os.path.join(NETNS_DIR, host.netns), os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NetnsError(f"host {host.index}'s namespace {host.netns!r} is gone: {e}") from e
    try:
        _libc_call(libc.setns, fd, CLONE_NEWNET)
    finally:
        os.close(fd)
    _libc_call(libc.unshare, CLONE_NEWUTS)
    name = host.hostname.encode()
    _libc_call(libc.sethostname, name, ctypes.c_size_t(len(name)))


def main(argv: Sequence[str]) -> int:
    """``python -m rustdist._netns check|cleanup``: says whether test hosts (and link delay)
    work here, or removes the namespaces of killed runs."""
    cmd = argv[0] if argv else "check"
    if cmd == "check":
        reason = unavailable_reason()
        print(f"test hosts: {'unavailable: ' + reason if reason else 'available'}")
        if not reason:
            how = "netem" if netem_available() else "a delay line in user space (no netem)"
            print(f"link delay: {how}")
        return 1 if reason else 0
    if cmd == "cleanup":
        for name in reap_stale():
            print(f"deleted {name}")
        return 0
    print("usage: python -m rustdist._netns {check|cleanup}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
