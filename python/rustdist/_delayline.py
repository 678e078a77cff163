"""A delay line between test hosts for kernels without netem: one NIC of every host is a TUN
device, and this process forwards the IPv4 packets each host sends to the host they are
addressed to, ``delay`` seconds (that sender's) after reading them.

It runs as ``python -m rustdist._delayline CONFIG`` (started and stopped by
:meth:`rustdist._netns.Hosts.shape`), CONFIG being JSON: a list of ``[netns, ifname, address,
delay_seconds]``, one per host. It attaches to every TUN device, prints ``ready`` and forwards
until killed (or its parent dies). A rate limit stays the kernel's job: ``tbf`` on the TUN
device shapes what the host sends before it reaches this line.

SIGUSR1 makes it alter the next TCP segment it forwards that carries at least
``ALTER_MIN_PAYLOAD`` bytes: one bit of the payload flipped, the checksum fixed, as a host on
the path would (what TLS must catch).
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Deque, Sequence

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
TUN_DEVICE = "/dev/net/tun"
#: Larger than any MTU a TUN device takes.
MAX_PACKET = 1 << 16
#: A segment this large is data, not a handshake or an acknowledgement.
ALTER_MIN_PAYLOAD = 1000


def alter(packet: bytes) -> bytes | None:
    """`packet` with one bit flipped in the middle of its TCP payload and the TCP checksum
    updated to match (RFC 1624); None when it is no TCP segment with a payload that large."""
    ihl = (packet[0] & 0x0F) * 4
    if packet[9] != socket.IPPROTO_TCP or len(packet) < ihl + 20:
        return None
    start = ihl + (packet[ihl + 12] >> 4) * 4
    if len(packet) - start < ALTER_MIN_PAYLOAD:
        return None
    out = bytearray(packet)
    at = start + (len(packet) - start) // 2
    word = at - (at - ihl) % 2  # the checksum sums 16-bit words from the TCP header on
    old = int.from_bytes(out[word:word + 2], "big")
    out[at] ^= 0x10
    new = int.from_bytes(out[word:word + 2], "big")
    total = (~int.from_bytes(out[ihl + 16:ihl + 18], "big") & 0xFFFF) + (~old & 0xFFFF) + new
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    out[ihl + 16:ihl + 18] = (~total & 0xFFFF).to_bytes(2, "big")
    return bytes(out)


def attach(netns_path: str, ifname: str) -> int:
    """A non-blocking fd on TUN device `ifname` of the network namespace at `netns_path`
    (this process moves into that namespace to find it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ns = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(ns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns_path})")
    finally:
        os.close(ns)
    fd = os.open(TUN_DEVICE, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def _prioritise() -> None:
    """Dies with the parent, and runs ahead of the ranks (a real-time priority where allowed)
    so that a busy machine stretches the delays as little as it can."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        pass


def forward(fds: Sequence[int], addrs: Sequence[str], delays: Sequence[float]) -> None:
    """Forwards forever: a packet read from ``fds[i]`` goes to the fd whose host has its
    destination address, ``delays[i]`` seconds later. Packets to other addresses (and
    non-IPv4 ones) are dropped, as a switch with no such port would."""
    to = {socket.inet_aton(a): fd for a, fd in zip(addrs, fds)}
    armed = [False]
    signal.signal(signal.SIGUSR1, lambda *_: armed.__setitem__(0, True))
    source = {fd: i for i, fd in enumerate(fds)}
    # A sender's delay is constant, so its packets fall due in the order they came.
    queues: list[Deque[tuple[float, int, bytes]]] = [collections.deque() for _ in fds]
    while True:
        due = [q[0][0] for q in queues if q]
        now = time.monotonic()
        timeout = max(0.0, min(due) - now) if due else None
        ready, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            i = source[fd]
            while True:
                try:
                    packet = os.read(fd, MAX_PACKET)
                except BlockingIOError:
                    break
                out = to.get(packet[16:20]) if packet[:1] and packet[0] >> 4 == 4 else None
                altered = alter(packet) if armed[0] and out is not None else None
                if altered is not None:
                    packet, armed[0] = altered, False
                if out is not None:
                    queues[i].append((now + delays[i], out, packet))
        now = time.monotonic()
        for q in queues:
            while q and q[0][0] <= now:
                _, out, packet = q.popleft()
                try:
                    os.write(out, packet)
                except OSError:
                    pass  # the receiving host's queue is full: dropped, as on a wire


def main(argv: Sequence[str]) -> int:
    """Attaches to the hosts of the JSON config in ``argv[0]``, says ``ready``, forwards."""
    links = json.loads(argv[0])
    _prioritise()
    fds = [attach(ns, ifname) for ns, ifname, _, _ in links]
    print("ready", flush=True)
    forward(fds, [addr for _, _, addr, _ in links], [float(d) for _, _, _, d in links])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
