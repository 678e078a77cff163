"""Cases for calls whose tensors share memory (issue 25), run inside the rank processes.

Every call that takes several tensors must give, for any pattern of repeated tensors and
overlapping views among its inputs and outputs, exactly what it gives when each is a separate
copy. ``case_alias_property`` draws such patterns at random (the same on every rank, from a
shared seed) and compares, element by element, the storage the aliased call leaves behind with
a copy-based reference: the same call on separate copies of every tensor, whose written copies
are then put back into a copy of the storage in the call's order (the last listed wins where
outputs overlap).

A pattern is a list of slots, one per tensor of the call; each slot is a view ``base[off:off+n]``
of one of a few flat base tensors. Base 0 is a shared pool, so slots on it overlap in whole or
in part; other bases are fresh tensors, and a slot may also repeat an earlier slot exactly
(the same tensor object listed twice).
"""

from __future__ import annotations

import random
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch

from harness import ctx

IS_TORCH = ctx.mode == "torch"
READ, WRITE, UPDATE = 1, 2, 3


class Slot(NamedTuple):
    base: int
    off: int
    n: int


class Call(NamedTuple):
    """A multi-tensor call: the roles and sizes of its tensors, and how to make it."""

    roles: list[int]
    sizes: list[int]
    #: run(dist, tensors, async_op) makes the call and returns its Work(s) when async.
    run: Callable[[Any, list[Any], bool], Any]
    #: How many leading slots the call has on this rank (rooted calls list fewer elsewhere).
    used: Optional[int] = None


def _wait(work: Any) -> None:
    for w in work if isinstance(work, list) else [work]:
        if w is not None:
            w.wait()


def _group_obj(dist: Any) -> Any:
    """The default group object: the torch-door methods live on it in both modes."""
    return dist.group.WORLD


def _call(op: str, world: int, rank: int, rng: random.Random) -> Call:
    """The call `op` with sizes drawn from `rng` (drawn alike on every rank)."""
    n = rng.choice([1, 2, 3, 4, 6])
    td = torch.distributed
    if op == "all_reduce_coalesced":
        k = rng.randint(1, 4)
        sizes = [rng.choice([1, 2, 3, 5]) for _ in range(k)]
        return Call([UPDATE] * k, sizes,
                    lambda d, ts, a: d.all_reduce_coalesced(ts, async_op=a))
    if op == "allreduce_coalesced_method":
        k = rng.randint(2, 4)
        sizes = [rng.choice([1, 2, 3, 5]) for _ in range(k)]
        return Call([UPDATE] * k, sizes, lambda d, ts, a: _group_obj(d).allreduce_coalesced(
            ts, td.AllreduceCoalescedOptions()))
    if op == "broadcast_method":
        k = rng.randint(2, 4)
        root = rng.randrange(world)
        sizes = [rng.choice([1, 2, 3, 5]) for _ in range(k)]

        def bcast(d: Any, ts: list[Any], a: bool) -> Any:
            opts = td.BroadcastOptions()
            opts.rootRank = root
            return [_group_obj(d).broadcast([t], opts) for t in ts]

        return Call([UPDATE] * k, sizes, bcast)
    if op == "all_gather":
        return Call([READ] + [WRITE] * world, [n] * (world + 1),
                    lambda d, ts, a: d.all_gather(ts[1:], ts[0], async_op=a))
    if op == "all_gather_coalesced":
        k = rng.randint(1, 3)
        sizes = [rng.choice([1, 2, 3]) for _ in range(k)]

        def agc(d: Any, ts: list[Any], a: bool) -> Any:
            lists = [ts[k + r * k:k + (r + 1) * k] for r in range(world)]
            return d.all_gather_coalesced(lists, ts[:k], async_op=a)

        return Call([READ] * k + [WRITE] * (k * world), sizes * (world + 1), agc)
    if op == "all_to_all":
        return Call([READ] * world + [WRITE] * world, [n] * (2 * world),
                    lambda d, ts, a: d.all_to_all(ts[world:], ts[:world], async_op=a))
    if op == "gather":
        dst = rng.randrange(world)
        return Call([READ] + [WRITE] * world, [n] * (world + 1),
                    lambda d, ts, a: d.gather(ts[0], ts[1:] if rank == dst else None, dst=dst,
                                              async_op=a),
                    used=world + 1 if rank == dst else 1)
    if op == "scatter":
        src = rng.randrange(world)
        return Call([WRITE] + [READ] * world, [n] * (world + 1),
                    lambda d, ts, a: d.scatter(ts[0], ts[1:] if rank == src else None, src=src,
                                               async_op=a),
                    used=world + 1 if rank == src else 1)
    if op == "reduce_scatter":
        return Call([WRITE] + [READ] * world, [n] * (world + 1),
                    lambda d, ts, a: d.reduce_scatter(ts[0], ts[1:], async_op=a))
    if op == "reduce_scatter_tensor":
        return Call([WRITE, READ], [n, n * world],
                    lambda d, ts, a: d.reduce_scatter_tensor(ts[0], ts[1], async_op=a))
    if op == "all_gather_into_tensor":
        return Call([WRITE, READ], [n * world, n],
                    lambda d, ts, a: d.all_gather_into_tensor(ts[0], ts[1], async_op=a))
    if op == "all_to_all_single":
        return Call([WRITE, READ], [n * world, n * world],
                    lambda d, ts, a: d.all_to_all_single(ts[0], ts[1], async_op=a))
    if op in ("allgather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"):
        k = rng.randint(1, 3)
        small = [rng.choice([1, 2, 3]) for _ in range(k)]
        big = [s * world for s in small]
        gathering = op == "allgather_into_tensor_coalesced"
        outs, ins = (big, small) if gathering else (small, big)
        c10d = torch._C._distributed_c10d
        opts = c10d.AllgatherOptions() if gathering else c10d.ReduceScatterOptions()

        def pairs(d: Any, ts: list[Any], a: bool) -> Any:
            return getattr(_group_obj(d), op)(ts[:k], ts[k:], opts)

        return Call([WRITE] * k + [READ] * k, outs + ins, pairs)
    if op == "batch_isend_irecv":
        k = rng.randint(1, 3)  # pairs of (send to next, receive from previous)
        sizes = [rng.choice([1, 2, 3, 4]) for _ in range(k)]
        nxt, prv = (rank + 1) % world, (rank - 1) % world

        def batch(d: Any, ts: list[Any], a: bool) -> Any:
            ops = []
            for j in range(k):
                ops.append(d.P2POp(d.isend, ts[2 * j], nxt, tag=j))
                ops.append(d.P2POp(d.irecv, ts[2 * j + 1], prv, tag=j))
            return d.batch_isend_irecv(ops)

        return Call([READ, WRITE] * k, [s for s in sizes for _ in (0, 1)], batch)
    raise ValueError(f"unknown op {op}")


def _pattern(sizes: list[int], rng: random.Random) -> tuple[list[Slot], list[int]]:
    """Slots for tensors of `sizes`, and the lengths of the bases they view (base 0: the
    shared pool)."""
    pool = max(sizes) * 2 + 2
    bases = [pool]
    slots: list[Slot] = []
    for i, n in enumerate(sizes):
        same = [s for s in slots if s.n == n]
        pick = rng.random()
        if same and pick < 0.25:
            slots.append(rng.choice(same))  # the very same tensor again
        elif pick < 0.8:
            step = rng.choice([1, max(n // 2, 1), n])
            off = rng.randrange(0, pool - n + 1, step)
            slots.append(Slot(0, off, n))
        else:
            bases.append(n)
            slots.append(Slot(len(bases) - 1, 0, n))
    return slots, bases


def _bases(lengths: list[int], rank: int, trial: int, dtype: torch.dtype,
           as_numpy: bool, device: str) -> list[Any]:
    out = []
    for b, n in enumerate(lengths):
        t = (torch.arange(n, dtype=torch.float64) + 1000 * (rank + 1) + 100 * b + trial % 7)
        t = t.to(dtype=dtype, device=device)
        out.append(t.numpy() if as_numpy else t)
    return out


def _views(bases: list[Any], slots: list[Slot]) -> list[Any]:
    made: dict[Slot, Any] = {}
    views = []
    for s in slots:
        if s not in made:  # a repeated slot is the same object
            made[s] = bases[s.base][s.off:s.off + s.n]
        views.append(made[s])
    return views


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


def _as_torch(x: Any) -> torch.Tensor:
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x.cpu()


def case_alias_property(dist: Any, rank: int, world: int, op: str, trials: int, seed: int,
                        async_op: bool = False, as_numpy: bool = False,
                        device: str = "cpu") -> int:
    """`trials` random aliasing patterns of `op` on tensors of `device`; returns how many had a
    written tensor sharing memory with another of the call's tensors (the driver checks some
    did)."""
    aliased = 0
    for trial in range(trials):
        rng = random.Random(f"{seed}:{op}:{world}:{trial}")
        call = _call(op, world, rank, rng)
        slots, lengths = _pattern(call.sizes, rng)
        used = call.used if call.used is not None else len(slots)
        slots, roles = slots[:used], call.roles[:used]
        dtype = torch.float32 if trial % 2 else torch.int64
        # The reference: the same call on separate copies, put back in the call's order.
        bases = _bases(lengths, rank, trial, dtype, as_numpy, device)
        expected = [_copy(b) for b in bases]
        copies = [_copy(v) for v in _views(bases, slots)]
        _wait(call.run(dist, copies, async_op))
        for s, role, c in zip(slots, roles, copies):
            if role & WRITE:
                expected[s.base][s.off:s.off + s.n] = c
        # The call itself, on views that share memory as drawn.
        views = _views(bases, slots)
        _wait(call.run(dist, views, async_op))
        for b, (got, want) in enumerate(zip(bases, expected)):
            got_t, want_t = _as_torch(got), _as_torch(want)
            if not torch.equal(got_t, want_t):
                bad = (got_t != want_t).nonzero().flatten().tolist()
                raise AssertionError(
                    f"{op} (async_op={async_op}) trial {trial} on rank {rank}: base {b} differs "
                    f"from the copy-based reference at {bad[:8]}: got {got_t[bad[:8]].tolist()},"
                    f" want {want_t[bad[:8]].tolist()}; slots {slots}, roles {roles}"
                )
        aliased += _shares(slots, roles)
    return aliased


def _shares(slots: list[Slot], roles: list[int]) -> bool:
    """Whether a written slot shares memory with another slot."""
    return any(roles[i] & WRITE and i != j and a.base == b.base and a.off < b.off + b.n
               and b.off < a.off + a.n
               for i, a in enumerate(slots) for j, b in enumerate(slots))


def case_all_reduce_coalesced_repeated(dist: Any, rank: int, world: int) -> None:
    """The issue's example: a tensor listed twice is reduced once (gloo's answer)."""
    t = torch.ones(3)
    dist.all_reduce_coalesced([t, t])
    assert torch.equal(t, torch.full((3,), float(world))), t
    t = torch.ones(3)
    dist.all_reduce_coalesced([t, t], async_op=True).wait()
    assert torch.equal(t, torch.full((3,), float(world))), t


def case_send_then_receive_into_it(dist: Any, rank: int, world: int, n: int) -> None:
    """isend(t) to the next rank, then irecv(t) from the previous one, posted one after the
    other (as torch.distributed's batch_isend_irecv posts them for backends without
    coalescing): the send carries t as it was when it was posted."""
    t = torch.arange(n, dtype=torch.float32) + 1000 * rank
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    works = [dist.isend(t, nxt, tag=7), dist.irecv(t, prv, tag=7)]
    for w in works:
        w.wait()
    want = torch.arange(n, dtype=torch.float32) + 1000 * prv
    assert torch.equal(t, want), f"rank {rank} received {t[:4].tolist()}..., want {want[:4].tolist()}..."
