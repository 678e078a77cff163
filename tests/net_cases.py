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


def peer_connections() -> set[tuple[str, int, str, int]]:
    """The connected TCP sockets this process holds, as (local address, port, remote address,
    port), but for those of the store (MASTER_ADDR:MASTER_PORT at either end). Each socket is
    asked for its addresses: /proc/net/tcp, read in several calls, is no snapshot and may skip
    a connection while others open or close."""
    store = (socket.gethostbyname(os.environ["MASTER_ADDR"]), int(os.environ["MASTER_PORT"]))
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:  # closed meanwhile
            continue
        with sock:
            if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                continue
            try:
                local, remote = sock.getsockname(), sock.getpeername()
            except OSError:  # a listener
                continue
        if store not in (local, remote):
            found.add((*local, *remote))
    return found


def _opened(before: set[tuple[str, int, str, int]]) -> dict[str, Any]:
    """The peer connections opened since `before` was taken: their local addresses and count
    (one per peer stream of the group made meanwhile; earlier groups' do not count)."""
    opened = peer_connections() - before
    return {"peer_ips": sorted({c[0] for c in opened}), "connections": len(opened)}


def case_where(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """This rank's hostname, MASTER_ADDR, and of a new group of every rank: the local addresses
    of the peer connections it opened, their count, and its streams per peer on other hosts
    (an all_reduce on it proves it works; an all_to_all links every peer, as links are made
    on first use)."""
    before = peer_connections()
    group = dist.new_group(list(range(world)))
    try:
        t = torch.ones(3)
        dist.all_reduce(t, group=group)
        assert t.tolist() == [float(world)] * 3, t
        out = torch.zeros(world, dtype=torch.int64)
        dist.all_to_all_single(out, torch.arange(world) + 10 * rank, group=group)
        assert out.tolist() == [10 * r + rank for r in range(world)], out
        return {"hostname": socket.gethostname(), "master": os.environ["MASTER_ADDR"],
                **_opened(before), "streams": group._pg.streams_per_peer}
    finally:
        dist.destroy_process_group(group)


def case_init_with_env(dist: Any, rank: int, world: int, env: dict[str, Optional[str]],
                       init_method: str = "env://", pg_timeout: float = 20.0) -> dict[str, Any]:
    """init_process_group with `env` set, an all_reduce, and destroy. Returns what happened:
    ``ok`` with the peer connections' local addresses, their count, the group's TCP link model
    (latency in seconds, bytes per second) and streams per peer, or the exception's type and
    text. The all_reduce moves 3 MiB too, more than one stripe of a striped link."""
    before = peer_connections()
    with environ(env):
        try:
            dist.init_process_group("rustdist", init_method=init_method, rank=rank,
                                    world_size=world, timeout=timedelta(seconds=pg_timeout))
        except Exception as e:  # noqa: BLE001 - the driver checks which error it was
            return {"ok": False, "type": type(e).__name__, "msg": str(e),
                    "trace": traceback.format_exc()}
        try:
            opened = _opened(before)
            pg = dist.group.WORLD._pg
            link_model, streams = pg.link_model, pg.streams_per_peer
            for n in (4, 3 << 18):
                t = torch.arange(n, dtype=torch.float32) * (rank + 1)
                dist.all_reduce(t)
                want = torch.arange(n, dtype=torch.float32) * (world * (world + 1) // 2)
                assert torch.equal(t, want), f"all_reduce of {n} float32 differs"
        finally:
            dist.destroy_process_group()
    return {"ok": True, **opened, "link_model": link_model, "streams": streams}
