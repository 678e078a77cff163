"""Cases for tests/test_profiler.py, run inside the rank processes of the shared worlds: every
operation, synchronous and asynchronous, under ``torch.profiler`` (and
``torch.autograd.profiler``); the events and their communication metadata checked against the
calls, and the exported Chrome trace read back.

``dist`` is rustdist (the import swap) or torch.distributed with backend "rustdist".
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Optional

import torch
from torch.profiler import ProfilerActivity, profile

#: Elements per rank of every call.
N = 6


def _calls(dist: Any, rank: int, world: int) -> list[tuple[str, Callable[[bool], Any], int, int]]:
    """(name the event must carry, call(async_op) -> Work or None, input and output elements)."""
    x = torch.arange(N, dtype=torch.float32) + rank
    out_list = [torch.empty(N) for _ in range(world)]
    big = torch.empty(N * world)
    chunks = torch.arange(N * world, dtype=torch.float32)
    root_list = [torch.empty(N) for _ in range(world)] if rank == 0 else []
    return [
        ("all_reduce", lambda a: dist.all_reduce(x.clone(), async_op=a), N, N),
        ("broadcast", lambda a: dist.broadcast(x.clone(), 0, async_op=a), N, N),
        ("reduce", lambda a: dist.reduce(x.clone(), 0, async_op=a), N, N),
        ("all_gather", lambda a: dist.all_gather(out_list, x, async_op=a), N, N * world),
        ("all_gather_into_tensor",
         lambda a: dist.all_gather_into_tensor(big, x, async_op=a), N, N * world),
        ("reduce_scatter_tensor",
         lambda a: dist.reduce_scatter_tensor(torch.empty(N), chunks, async_op=a), N * world, N),
        ("all_to_all_single",
         lambda a: dist.all_to_all_single(torch.empty(N * world), chunks, async_op=a),
         N * world, N * world),
        ("reduce_scatter",
         lambda a: dist.reduce_scatter(torch.empty(N), list(chunks.chunk(world)), async_op=a),
         N * world, N),
        ("all_to_all",
         lambda a: dist.all_to_all([torch.empty(N) for _ in range(world)],
                                   list(chunks.chunk(world)), async_op=a), N * world, N * world),
        ("gather", lambda a: dist.gather(x, root_list or None, dst=0, async_op=a), N,
         len(root_list) * N),
        ("scatter", lambda a: dist.scatter(torch.empty(N), [c.clone() for c in root_list] or None,
                                           src=0, async_op=a), len(root_list) * N, N),
        ("barrier", lambda a: dist.barrier(async_op=a), 0, 0),
    ]


def _events(prof: Any) -> list[Any]:
    """rustdist's events of a torch.profiler or torch.autograd.profiler session."""
    events = prof.events() if hasattr(prof, "events") else prof.function_events
    return [e for e in events if e.name.startswith("rustdist:")]


#: What torch's door runs a call as, where that differs (torch hands a reduce_scatter of a
#: list to the group's reduce_scatter of one tensor).
ALIASES = {"reduce_scatter": ("reduce_scatter", "reduce_scatter_tensor")}


def _check(events: list[Any], calls: list[tuple[str, Any, int, int]], world: int,
           rank: int) -> list[int]:
    """Each call's span and metadata events, in the order the calls were made, checked
    against the call; returns their sequence numbers."""
    def by_start(es: list[Any]) -> list[Any]:
        return sorted(es, key=lambda e: e.time_range.start)

    metas = by_start([e for e in events if e.name == "rustdist:record_param_comms"])
    spans = by_start([e for e in events if e.name != "rustdist:record_param_comms"])
    assert len(metas) == len(spans) == len(calls), [e.name for e in events]
    seqs = []
    for (name, _, ins, outs), meta, span in zip(calls, metas, spans):
        m = meta.kwinputs
        assert m["Collective name"] in ALIASES.get(name, (name,)), (name, m)
        assert span.name == f"rustdist:{m['Collective name']}", (span.name, m)
        want = {"In msg nelems": ins, "Out msg nelems": outs, "Group size": world, "Rank": rank,
                "Process Group Ranks": str(list(range(world))), "Process Group Description":
                "default_pg", "Global rank start": 0, "Global rank stride": 1,
                "dtype": "Float" if ins or outs else "Byte"}
        for k, v in want.items():
            assert m[k] == v, (name, k, m[k], v, m)
        assert m["Process Group Name"], m
        seqs.append(int(m["Seq"]))
    return seqs


def case_profiled_ops(dist: Any, rank: int, world: int, autograd: bool) -> dict[str, Any]:
    """Each call once synchronously and once asynchronously, under torch.profiler (or
    torch.autograd.profiler), recording shapes (which keeps the metadata); every event is
    checked, sequence numbers rise by one per collective, and the exported trace holds them
    with their metadata as args."""
    found: dict[str, int] = {}
    for async_op in (False, True):
        ctx_manager = (torch.autograd.profiler.profile(record_shapes=True) if autograd else
                       profile(activities=[ProfilerActivity.CPU], record_shapes=True))
        with ctx_manager as prof:
            works = [call(async_op) for _, call, _, _ in _calls(dist, rank, world)]
            for w in works:
                if w is not None:
                    w.wait()
        events = _events(prof)
        seqs = _check(events, _calls(dist, rank, world), world, rank)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        found[f"async={async_op}"] = len(events)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {e.name for e in events} <= names, names
        metas = [e["args"] for e in trace["traceEvents"]
                 if e.get("name") == "rustdist:record_param_comms"]
        assert {m["Collective name"] for m in metas} >= {"all_reduce", "all_to_all_single"}
        assert all("In msg nelems" in m and "Process Group Ranks" in m for m in metas), metas
    return found


def case_profiled_p2p_spans_completion(dist: Any, rank: int, world: int) -> Optional[float]:
    """An irecv's event spans until the message arrives, not until the call returns: rank 1
    sends only after a barrier that rank 0 enters after issuing its irecv, so rank 0's irecv
    event must end after its barrier event starts. Returns that margin (us) on rank 0."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        buf = torch.zeros(N)
        work = None
        if rank == 0:
            work = dist.irecv(buf, src=1)
        dist.barrier()
        if rank == 1:
            dist.send(torch.full((N,), 7.0), dst=0)
        if work is not None:
            work.wait()
            assert buf.tolist() == [7.0] * N, buf
    if rank != 0:
        return None
    events = _events(prof)
    recv = [e for e in events if e.name == "rustdist:irecv"]
    barrier = [e for e in events if e.name == "rustdist:barrier"]
    assert len(recv) == 1 and len(barrier) == 1, [e.name for e in events]
    margin = recv[0].time_range.end - barrier[0].time_range.start
    assert margin > 0, (recv[0].time_range, barrier[0].time_range)
    return margin


def case_unprofiled_ops_record_nothing(dist: Any, rank: int, world: int) -> None:
    """With no profiler active, an operation leaves no event behind (the next profile starts
    empty) and the group's sequence numbers still count."""
    dist.all_reduce(torch.ones(N))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pass
    assert not _events(prof), [e.name for e in prof.events()]
