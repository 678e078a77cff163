"""Cases for tests/test_tls.py, run by the harness's rank processes as ``"tls_cases:<name>"``:
every kind of operation on a group made with given TLS settings (each result checked element
by element against what it must be, and digested for the driver to compare runs), a known
pattern on the wire, and a collective whose data a host on the path alters."""

from __future__ import annotations

import hashlib
import os
import time
import traceback
from datetime import timedelta
from typing import Any, Optional

import torch

from harness import ctx
from net_cases import environ

#: What the capture test looks for on the wire.
PATTERN = b"RUSTDIST-PLAINTEXT-PATTERN-"


def _init(dist: Any, rank: int, world: int, init_method: str, pg_timeout: float) -> None:
    dist.init_process_group("rustdist", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=pg_timeout))


def _failed(e: BaseException) -> dict[str, Any]:
    return {"ok": False, "type": type(e).__name__, "msg": str(e), "trace": traceback.format_exc()}


def _check(name: str, got: torch.Tensor, want: torch.Tensor, out: dict[str, str]) -> None:
    """Asserts `got` equals `want` element by element and records its digest under `name`."""
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.shape, want.shape)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, f"{name}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}"
    out[name] = hashlib.sha256(got.numpy().tobytes()).hexdigest()


def _every_op(dist: Any, rank: int, world: int) -> dict[str, str]:
    """Runs every collective and point-to-point operation once, checked; their digests."""
    w, r = world, rank
    tri = w * (w + 1) // 2
    out: dict[str, str] = {}
    n = (3 << 18) + 5  # 3 MiB of float32: several stripes of a striped link
    t = torch.arange(n, dtype=torch.float32) * (r + 1)
    dist.all_reduce(t)
    _check("all_reduce", t, torch.arange(n, dtype=torch.float32) * tri, out)
    small = torch.tensor([r + 1, -r], dtype=torch.int64)
    dist.all_reduce(small, op=dist.ReduceOp.MAX)
    _check("all_reduce_max", small, torch.tensor([w, 0], dtype=torch.int64), out)
    src = w - 1
    pattern = (torch.arange(1 << 20) * 7 + src) % 251
    b = pattern.to(torch.uint8) if r == src else torch.zeros(1 << 20, dtype=torch.uint8)
    dist.broadcast(b, src=src)
    _check("broadcast", b, pattern.to(torch.uint8), out)
    k = 70_001
    mine = torch.arange(k, dtype=torch.int32) + r * 100_000
    gathered = torch.empty(w * k, dtype=torch.int32)
    dist.all_gather_into_tensor(gathered, mine)
    want = torch.cat([torch.arange(k, dtype=torch.int32) + q * 100_000 for q in range(w)])
    _check("all_gather_into_tensor", gathered, want, out)
    parts = [torch.empty(k, dtype=torch.int32) for _ in range(w)]
    dist.all_gather(parts, mine)
    _check("all_gather", torch.cat(parts), want, out)
    rs_in = torch.arange(w * k, dtype=torch.float64) * (r + 1)
    rs_out = torch.empty(k, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs_out, rs_in)
    _check("reduce_scatter_tensor", rs_out,
           torch.arange(r * k, (r + 1) * k, dtype=torch.float64) * tri, out)
    a2a_in = torch.cat([torch.arange(k, dtype=torch.int64) + r * 1000 + j * 10 for j in range(w)])
    a2a_out = torch.empty(w * k, dtype=torch.int64)
    dist.all_to_all_single(a2a_out, a2a_in)
    _check("all_to_all_single", a2a_out,
           torch.cat([torch.arange(k, dtype=torch.int64) + j * 1000 + r * 10 for j in range(w)]),
           out)
    red = torch.full((k,), float(r))
    dist.reduce(red, dst=0, op=dist.ReduceOp.MAX)
    _check("reduce", red, torch.full((k,), float(w - 1 if r == 0 else r)), out)
    g_list = [torch.empty(k) for _ in range(w)] if r == 0 else None
    dist.gather(torch.full((k,), float(r)), gather_list=g_list, dst=0)
    if r == 0:
        assert g_list is not None
        want = torch.cat([torch.full((k,), float(q)) for q in range(w)])
        _check("gather", torch.cat(g_list), want, out)
    sc = torch.empty(k)
    dist.scatter(sc, scatter_list=[torch.full((k,), float(q) + 0.5) for q in range(w)] if r == 0
                 else None, src=0)
    _check("scatter", sc, torch.full((k,), r + 0.5), out)
    # Point-to-point round the ring, blocking and posted, 1 MiB each way.
    nxt, prv = (r + 1) % w, (r - 1) % w
    p = 1 << 18
    send = torch.arange(p, dtype=torch.float32) + r * 3
    got = torch.empty(p)
    ops = [dist.P2POp(dist.isend, send, nxt, tag=5), dist.P2POp(dist.irecv, got, prv, tag=5)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    _check("batch_isend_irecv", got, torch.arange(p, dtype=torch.float32) + prv * 3, out)
    if r % 2 == 0:
        dist.send(send, dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(send, dst=nxt)
    _check("send_recv", got, torch.arange(p, dtype=torch.float32) + prv * 3, out)
    objs: list[Any] = [None] * w
    dist.all_gather_object(objs, {"rank": r, "word": "tls" * r})
    assert objs == [{"rank": q, "word": "tls" * q} for q in range(w)], objs
    dist.barrier()
    return out


def case_ops(dist: Any, rank: int, world: int, env: dict[str, Optional[str]],
             init_method: str = "env://", pg_timeout: float = 30.0) -> dict[str, Any]:
    """With `env` set: init, every operation (checked), destroy. Their digests, or the error."""
    with environ(env):
        try:
            _init(dist, rank, world, init_method, pg_timeout)
        except Exception as e:  # noqa: BLE001 - the driver checks which error it was
            return _failed(e)
        try:
            return {"ok": True, "digests": _every_op(dist, rank, world)}
        except Exception as e:  # noqa: BLE001
            return _failed(e)
        finally:
            dist.destroy_process_group()


def case_busy_peer(dist: Any, rank: int, world: int,
                   env: dict[str, Optional[str]]) -> dict[str, Any]:
    """With `env` set, world 4 (ranks 0 and 2, 1 and 3 not ring neighbours, so linked on
    first use): rank 0 sends to rank 2 and rank 3 to rank 1 while the receivers wait on the
    store, outside any rustdist operation, for word that the send is done; then they receive.
    The receiving rank's TLS handshake must not need a call from it."""
    with environ(env):
        _init(dist, rank, world, "env://", 20.0)
        try:
            store = dist.distributed_c10d._get_default_store()
            dist.barrier()
            pairs = {0: 2, 3: 1}
            t = torch.arange(1000, dtype=torch.int64) * (rank + 1)
            if rank in pairs:
                dist.send(t, dst=pairs[rank])
                store.set(f"busy_peer/sent/{rank}", "1")
            else:
                src = next(s for s, d in pairs.items() if d == rank)
                store.wait([f"busy_peer/sent/{src}"])
                got = torch.empty_like(t)
                dist.recv(got, src=src)
                assert torch.equal(got, torch.arange(1000, dtype=torch.int64) * (src + 1))
            dist.barrier()
        except Exception as e:  # noqa: BLE001 - the driver checks which error it was
            return _failed(e)
        finally:
            dist.destroy_process_group()
    return {"ok": True}


def case_pattern(dist: Any, rank: int, world: int, env: dict[str, Optional[str]]) -> dict[str, Any]:
    """With `env` set: rank 0 broadcasts 256 KiB of PATTERN and all_gathers it once more."""
    with environ(env):
        _init(dist, rank, world, "env://", 30.0)
        try:
            data = (PATTERN * ((256 << 10) // len(PATTERN) + 1))[: 256 << 10]
            want = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            t = want.clone() if rank == 0 else torch.zeros_like(want)
            dist.broadcast(t, src=0)
            assert torch.equal(t, want)
            out = torch.empty(world * want.numel(), dtype=torch.uint8)
            dist.all_gather_into_tensor(out, t)
            assert torch.equal(out, want.repeat(world))
        finally:
            dist.destroy_process_group()
    return {"ok": True}


def case_altered(dist: Any, rank: int, world: int, env: dict[str, Optional[str]],
                 go: str) -> dict[str, Any]:
    """With `env` set: init and a barrier, then a note to the driver, which has the delay
    line alter the next data segment and creates file `go`; then a 4 MiB all_reduce. Whether
    its result was right, or the error."""
    with environ(env):
        _init(dist, rank, world, "env://", 20.0)
        try:
            dist.barrier()
            ctx.notify("ready")
            deadline = time.monotonic() + 30
            while not os.path.exists(go):
                assert time.monotonic() < deadline, "the driver never said go"
                time.sleep(0.01)
            n = 1 << 20
            t = torch.arange(n, dtype=torch.float32) * (rank + 1)
            try:
                dist.all_reduce(t)
            except Exception as e:  # noqa: BLE001 - the driver checks which error it was
                return _failed(e)
            want = torch.arange(n, dtype=torch.float32) * (world * (world + 1) // 2)
            return {"ok": True, "right": bool(torch.equal(t, want))}
        finally:
            dist.destroy_process_group()
