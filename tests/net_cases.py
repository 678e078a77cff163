"""Cases for the network tests (test_netns.py, test_net_security.py), run by the harness's rank
processes as ``"net_cases:<name>"``: which interface peers connect over, which host a rank is
on, and group formation with and without an auth key."""

from __future__ import annotations

import os
import socket
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator, Optional

import torch


def _set_environ(values: dict[str, Optional[str]]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextmanager
def environ(values: dict[str, Optional[str]]) -> Iterator[None]:
    """Sets (or, for None, removes) environment variables for the block, then restores them."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set_environ(values)
        yield
    finally:
        _set_environ(saved)


def _ipv4(hex_addr: str) -> tuple[str, int]:
    """An address of /proc/net/tcp ("0100007F:1F90") as ("127.0.0.1", 8080)."""
    ip, port = hex_addr.split(":")
    return socket.inet_ntoa(int(ip, 16).to_bytes(4, "little")), int(port, 16)


def peer_connection_ips() -> list[str]:
    """The local IPv4 addresses of this process's network namespace's established TCP
    connections, but for those of the store (MASTER_PORT): the peer links of the group."""
    store_port = int(os.environ["MASTER_PORT"])
    ips = []
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            (local, lport), (_, rport) = _ipv4(fields[1]), _ipv4(fields[2])
            if fields[3] == "01" and store_port not in (lport, rport):
                ips.append(local)
    return sorted(set(ips))


def case_where(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """This rank's hostname, MASTER_ADDR and the local addresses of its peer connections (the
    group is initialised; an all_reduce proves it works)."""
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 3, t
    return {"hostname": socket.gethostname(), "master": os.environ["MASTER_ADDR"],
            "peer_ips": peer_connection_ips()}


def case_init_with_env(dist: Any, rank: int, world: int, env: dict[str, Optional[str]],
                       init_method: str = "env://", pg_timeout: float = 20.0) -> dict[str, Any]:
    """init_process_group with `env` set, an all_reduce, and destroy. Returns what happened:
    ``ok`` with the peer connections' local addresses and the group's TCP link model
    (latency in seconds, bytes per second), or the exception's type and text."""
    with environ(env):
        try:
            dist.init_process_group("rustdist", init_method=init_method, rank=rank,
                                    world_size=world, timeout=timedelta(seconds=pg_timeout))
        except Exception as e:  # noqa: BLE001 - the driver checks which error it was
            return {"ok": False, "type": type(e).__name__, "msg": str(e),
                    "trace": traceback.format_exc()}
        try:
            ips = peer_connection_ips()
            link_model = dist.group.WORLD._pg.link_model
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t)
            assert t.tolist() == [float(world * (world + 1) // 2)] * 4, t
        finally:
            dist.destroy_process_group()
    return {"ok": True, "peer_ips": ips, "link_model": link_model}
