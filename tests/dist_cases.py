"""Test cases run inside the rank processes (see harness.py).

Every case is ``case_<name>(dist, rank, world, **params)``: ``dist`` is ``rustdist`` or
``torch.distributed``; all ranks of a world run the same case with the same params. A case
raises on failure (the driver reports the traceback) and may return a picklable value.

Data is chosen so that every expected result is exact in every dtype (sums of halves that stay
below 2**6, products of powers of two, min/max picking an input), so results are compared
bit for bit; only AVG at world sizes that are not powers of two uses a tolerance.
"""

from __future__ import annotations

import math
import os
import re
import time
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from harness import ctx

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
FLOAT_DTYPES = ["float32", "float64", "float16", "bfloat16"]
#: Shapes of the tensors every collective case runs through: empty, one element, sizes that
#: do not divide by any world size > 1, a 2-D shape, both sides of the 112 bytes that travel
#: inline with a shared-memory flag (28 and 29 float32), and one element past a 1 MiB
#: shared-memory slot in float32 (it takes two slot rounds; large enough for ring algorithms).
SHAPES: list[tuple[int, ...]] = [(0,), (1,), (7,), (28,), (29,), (1001,), (2, 3), (262_145,)]
#: Per-rank output shapes of reduce_scatter_tensor (inputs are world times larger).
RS_SHAPES: list[tuple[int, ...]] = [(0,), (1,), (7,), (1001,), (2, 3), (75_001,)]


# ---------------------------------------------------------------------------------------------
# Data and checks


def gen(kind: str, dtype: torch.dtype, shape: Sequence[int], rank: int, seed: int = 0) -> torch.Tensor:
    """Deterministic input of `rank`; any rank can rebuild any other rank's data.

    kind "sum": halves in [-8, 8] (small integers for integer dtypes) so sums are exact;
    "product": values in {±0.5, ±1, ±2} (integers {±1, ±2}, uint8 {1, 2, 3}) so products are
    exact; "any": full-range data (randn*1000 for floats, the whole integer range)."""
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * rank + 17)
    n = math.prod(shape)
    if dtype == torch.bool:
        high = 5 if kind == "product" else 2  # mostly True for AND, else half/half
        return (torch.randint(0, high, (n,), generator=g) > 0).reshape(shape)
    if kind == "sum":
        if dtype.is_floating_point:
            v = torch.randint(-16, 17, (n,), generator=g).double() / 2
        elif dtype == torch.uint8:
            v = torch.randint(0, 17, (n,), generator=g)
        else:
            v = torch.randint(-8, 9, (n,), generator=g)
    elif kind == "product":
        if dtype.is_floating_point:
            choices = torch.tensor([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=torch.float64)
        elif dtype == torch.uint8:
            choices = torch.tensor([1, 2, 3])
        else:
            choices = torch.tensor([-2, -1, 1, 2])
        v = choices[torch.randint(0, len(choices), (n,), generator=g)]
    elif kind == "any":
        if dtype.is_floating_point:
            v = torch.randn(n, generator=g, dtype=torch.float64) * 1000
        else:
            info = torch.iinfo(dtype)
            v = torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64)
    else:
        raise ValueError(kind)
    return v.to(dtype).reshape(shape)


def data_kind(op: str) -> str:
    return {"SUM": "sum", "AVG": "sum", "PRODUCT": "product"}.get(op, "any")


def reduce_ref(xs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of `xs` over ranks, computed locally (exact for the data of gen())."""
    st = torch.stack(list(xs))
    dtype = xs[0].dtype
    if dtype == torch.bool:
        return st.any(0) if op in ("SUM", "MAX") else st.all(0)
    if op == "SUM":
        return st.sum(0).to(dtype)
    if op == "PRODUCT":
        return st.prod(0).to(dtype)
    if op == "MIN":
        return st.amin(0)
    if op == "MAX":
        return st.amax(0)
    if op == "AVG":
        return (st.double().sum(0) / len(xs)).to(dtype)
    raise ValueError(op)


def check(actual: Any, expected: torch.Tensor, what: str, op: str = "SUM") -> None:
    """Asserts dtype, shape and values (exact, except AVG at world sizes 3: a few ulps)."""
    if isinstance(actual, np.ndarray):
        actual = torch.from_numpy(actual)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol: dict[str, Any] = {"rtol": 0.0, "atol": 0.0}
    if op == "AVG":
        tol = {"rtol": {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(expected.dtype, 1e-6),
               "atol": 1e-5}
    try:
        torch.testing.assert_close(actual, expected, **tol)
    except AssertionError as e:
        raise AssertionError(f"{what}:\n{e}") from None


def expect_raises(types: Any, pattern: str, fn: Callable[[], Any], what: str) -> BaseException:
    """Calls fn, asserts it raises one of `types` whose message matches regex `pattern`."""
    try:
        fn()
    except types as e:
        if not re.search(pattern, str(e), re.IGNORECASE):
            raise AssertionError(
                f"{what}: raised {type(e).__name__} but the message does not match "
                f"{pattern!r}: {e}") from e
        return e
    except BaseException as e:
        raise AssertionError(f"{what}: expected {types} matching {pattern!r}, "
                             f"got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{what}: expected {types} matching {pattern!r}, nothing was raised")


def rop(dist: Any, op: str) -> Any:
    return getattr(dist.ReduceOp, op)


def sanity(dist: Any, world: int) -> None:
    """A small all_reduce proving the group still works (after an expected error)."""
    t = torch.ones(3, dtype=torch.int64)
    dist.all_reduce(t)
    check(t, torch.full((3,), world, dtype=torch.int64), "sanity all_reduce after the error")


# ---------------------------------------------------------------------------------------------
# Collectives


def case_link(dist: Any, rank: int, world: int, expected: str) -> None:
    """The default group's ranks reach each other over `expected` ("shm", "tcp" or
    "hierarchical"): the layout the run asked for (RUSTDIST_SHM, RUSTDIST_TEST_HOSTS)."""
    link = dist.group.WORLD._pg.link
    assert link == expected, f"rank {rank}: the default group runs over {link}, not {expected}"


def case_all_reduce(dist: Any, rank: int, world: int, dtype: str, op: str,
                    shapes: Sequence[tuple[int, ...]] = SHAPES + [()]) -> None:
    dt = DTYPES[dtype]
    for i, shape in enumerate(shapes):
        xs = [gen(data_kind(op), dt, shape, r, seed=i) for r in range(world)]
        t = xs[rank].clone()
        assert dist.all_reduce(t, op=rop(dist, op)) is None
        check(t, reduce_ref(xs, op), f"all_reduce {op} {dtype} shape {shape} rank {rank}", op)


def case_broadcast(dist: Any, rank: int, world: int, dtype: str, src: int) -> None:
    dt = DTYPES[dtype]
    for i, shape in enumerate(SHAPES + [()]):
        xs = [gen("any", dt, shape, r, seed=i) for r in range(world)]
        t = xs[rank].clone()
        assert dist.broadcast(t, src=src) is None
        check(t, xs[src], f"broadcast src {src} {dtype} shape {shape} rank {rank}")


def case_all_gather(dist: Any, rank: int, world: int, dtype: str) -> None:
    dt = DTYPES[dtype]
    for i, shape in enumerate(SHAPES):
        xs = [gen("any", dt, shape, r, seed=i) for r in range(world)]
        out = [torch.zeros(shape, dtype=dt) for _ in range(world)]
        assert dist.all_gather(out, xs[rank]) is None
        for r in range(world):
            check(out[r], xs[r], f"all_gather {dtype} shape {shape} rank {rank}: block of rank {r}")


def case_all_gather_into_tensor(dist: Any, rank: int, world: int, dtype: str, layout: str) -> None:
    """layout "flat": output is the inputs concatenated along dim 0 (world*n elements);
    "stacked": output has shape (world, *input.shape)."""
    dt = DTYPES[dtype]
    for i, shape in enumerate(SHAPES):
        xs = [gen("any", dt, shape, r, seed=i) for r in range(world)]
        expected = torch.cat(xs) if layout == "flat" else torch.stack(xs)
        out = torch.zeros(expected.shape, dtype=dt)
        assert dist.all_gather_into_tensor(out, xs[rank]) is None
        check(out, expected, f"all_gather_into_tensor {layout} {dtype} shape {shape} rank {rank}")


def case_reduce_scatter_tensor(dist: Any, rank: int, world: int, dtype: str, op: str,
                               layout: str = "flat") -> None:
    """Input: world blocks of the output's shape, concatenated along dim 0 ("flat") or stacked
    as (world, *shape); rank r receives block r reduced over ranks."""
    dt = DTYPES[dtype]
    for i, shape in enumerate(RS_SHAPES):
        blocks = [[gen(data_kind(op), dt, shape, r, seed=1000 * i + b) for b in range(world)]
                  for r in range(world)]
        inp = (torch.cat if layout == "flat" else torch.stack)(blocks[rank])
        out = torch.zeros(shape, dtype=dt)
        assert dist.reduce_scatter_tensor(out, inp, op=rop(dist, op)) is None
        expected = reduce_ref([blocks[r][rank] for r in range(world)], op)
        check(out, expected, f"reduce_scatter_tensor {layout} {op} {dtype} output shape {shape} rank {rank}", op)


def _views(base: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Contiguous views into `base` (48 elements) that do not start at its first element or
    do not cover it: the fast path reads their address, length and layout from torch."""
    return [
        ("offset slice", base[5:18]),
        ("0-dim element", base[7]),
        ("rows of a matrix", base.view(6, 8)[2:4]),
        ("size-1 dims with odd strides", base[9:21].as_strided((3, 1, 4), (4, 99, 1))),
    ]


def case_views(dist: Any, rank: int, world: int, dtype: str) -> None:
    """all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor on views into
    a larger buffer: the view's elements are right and every element around it is untouched."""
    dt = DTYPES[dtype]
    for i, (what, _) in enumerate(_views(torch.zeros(48))):
        xs = [gen("sum", dt, (48,), r, seed=i) for r in range(world)]  # exact sums
        views = [dict(_views(x))[what] for x in xs]
        for name in ("all_reduce", "broadcast"):
            base = xs[rank].clone()
            view = dict(_views(base))[what]
            if name == "all_reduce":
                dist.all_reduce(view)
                want = reduce_ref(views, "SUM")
            else:
                dist.broadcast(view, src=world - 1)
                want = views[world - 1]
            check(view, want, f"{name} on a view ({what}) {dtype} rank {rank}")
            outside = torch.ones(48, dtype=torch.bool)
            dict(_views(outside))[what].fill_(False)
            check(base[outside], xs[rank][outside],
                  f"{name} on a view ({what}) {dtype} rank {rank}: elements outside the view")
        n = views[rank].numel()
        big = torch.zeros(world * n + 3, dtype=dt)
        dist.all_gather_into_tensor(big[2:2 + world * n], views[rank].reshape(-1))
        check(big[2:2 + world * n], torch.cat([v.reshape(-1) for v in views]),
              f"all_gather_into_tensor into a view ({what}) {dtype} rank {rank}")
        check(big[[0, 1, -1]], torch.zeros(3, dtype=dt),
              f"all_gather_into_tensor into a view ({what}) {dtype} rank {rank}: outside it")
        if dt != torch.bool:
            ins = [torch.cat([v.reshape(-1)] * world) for v in views]
            out = torch.zeros(n + 2, dtype=dt)
            dist.reduce_scatter_tensor(out[1:1 + n], ins[rank])
            check(out[1:1 + n], reduce_ref([v.reshape(-1) for v in views], "SUM"),
                  f"reduce_scatter_tensor into a view ({what}) {dtype} rank {rank}")
            check(out[[0, -1]], torch.zeros(2, dtype=dt),
                  f"reduce_scatter_tensor into a view ({what}) {dtype} rank {rank}: outside it")


def case_aliased(dist: Any, rank: int, world: int) -> None:
    """Outputs that share memory with inputs give what separate buffers give: all_to_all_single
    in place (even and uneven splits, block lengths on both sides of the shared-memory slot and
    past the 4 MiB own-block copy), into a view that overlaps the input by half a block,
    all_to_all with one list as both, and gather and scatter whose root list holds the root's
    own tensor."""

    def block(src: int, dst: int, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.int64) + src * 10**9 + dst * 10**6

    for n in (1, 7, 5000, 1_100_000):
        t = torch.cat([block(rank, q, n) for q in range(world)])
        dist.all_to_all_single(t, t)
        check(t, torch.cat([block(q, rank, n) for q in range(world)]),
              f"all_to_all_single(t, t), {n} per block, rank {rank}")
        # Output starts half a block into the input: every output block but the last
        # overwrites input that is still to be sent.
        buf = torch.zeros((world + 1) * n, dtype=torch.int64)
        buf[:world * n] = torch.cat([block(rank, q, n) for q in range(world)])
        dist.all_to_all_single(buf[n // 2:n // 2 + world * n], buf[:world * n])
        check(buf[n // 2:n // 2 + world * n], torch.cat([block(q, rank, n) for q in range(world)]),
              f"all_to_all_single into an overlapping view, {n} per block, rank {rank}")
    # Symmetric uneven splits: rank r and q exchange r + q + 1 elements each way.
    splits = [rank + q + 1 for q in range(world)]
    t = torch.cat([block(rank, q, splits[q]) for q in range(world)])
    dist.all_to_all_single(t, t, output_split_sizes=splits, input_split_sizes=splits)
    check(t, torch.cat([block(q, rank, splits[q]) for q in range(world)]),
          f"all_to_all_single(t, t) with uneven splits, rank {rank}")
    blocks = [block(rank, q, 3 + rank + q) for q in range(world)]
    dist.all_to_all(blocks, blocks)
    for q, b in enumerate(blocks):
        check(b, block(q, rank, 3 + rank + q), f"all_to_all(xs, xs): block from {q}, rank {rank}")
    root = world - 1
    t = block(rank, rank, 9)
    xs = [torch.zeros(9, dtype=torch.int64) for _ in range(world)] if rank == root else None
    if xs is not None:
        xs[root] = t
    dist.gather(t, xs, dst=root)
    if xs is not None:
        for q, x in enumerate(xs):
            check(x, block(q, q, 9), f"gather into a list holding the root's input: from {q}")
    xs = [block(root, q, 9) for q in range(world)] if rank == root else None
    t = xs[root] if xs is not None else torch.zeros(9, dtype=torch.int64)
    dist.scatter(t, xs, src=root)
    check(t, block(root, rank, 9), f"scatter from a list holding the root's output, rank {rank}")


def case_barrier(dist: Any, rank: int, world: int, directory: str, rounds: int = 3) -> None:
    """Each rank creates a file, then barrier(); after it every rank's file must exist."""
    for k in range(rounds):
        with open(os.path.join(directory, f"round{k}-rank{rank}"), "w") as f:
            f.write("x")
        assert dist.barrier() is None
        missing = [r for r in range(world) if not os.path.exists(os.path.join(directory, f"round{k}-rank{r}"))]
        assert not missing, f"barrier round {k} returned on rank {rank} before ranks {missing} reached it"


def case_group_world_argument(dist: Any, rank: int, world: int) -> None:
    """Passing group=dist.group.WORLD explicitly is the same as the default group."""
    g = dist.group.WORLD
    assert dist.get_rank(g) == rank and dist.get_world_size(g) == world
    t = torch.full((5,), rank + 1, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=g)
    check(t, torch.full((5,), world * (world + 1) // 2, dtype=torch.int32), "all_reduce(group=WORLD)")
    t = torch.full((3,), rank, dtype=torch.float32)
    dist.broadcast(t, src=world - 1, group=g)
    check(t, torch.full((3,), world - 1, dtype=torch.float32), "broadcast(group=WORLD)")
    dist.barrier(group=g)


def case_complex(dist: Any, rank: int, world: int, dtype: str) -> None:
    """Complex tensors: all_reduce SUM, broadcast, all_gather_into_tensor."""
    dt = {"complex64": torch.complex64, "complex128": torch.complex128}[dtype]
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}[dt]
    for i, shape in enumerate([(0,), (1,), (1001,)]):
        xs = [torch.complex(gen("sum", real, shape, r, seed=i), gen("sum", real, shape, r, seed=i + 50))
              for r in range(world)]
        t = xs[rank].clone()
        dist.all_reduce(t)
        check(t, torch.stack(xs).sum(0), f"all_reduce SUM {dtype} shape {shape}")
        t = xs[rank].clone()
        dist.broadcast(t, src=0)
        check(t, xs[0], f"broadcast {dtype} shape {shape}")
        out = torch.zeros(world * shape[0], dtype=dt)
        dist.all_gather_into_tensor(out, xs[rank])
        check(out, torch.cat(xs), f"all_gather_into_tensor {dtype} shape {shape}")
    # A conjugate view's memory holds the unconjugated values: raised on, as torch does.
    t = torch.complex(torch.ones(3, dtype=real), torch.ones(3, dtype=real))
    out = torch.zeros(3 * world, dtype=dt)
    for what, call in [("all_reduce", lambda: dist.all_reduce(t.conj())),
                       ("broadcast", lambda: dist.broadcast(t.conj(), src=0)),
                       ("all_gather_into_tensor input",
                        lambda: dist.all_gather_into_tensor(out, t.conj())),
                       ("all_gather_into_tensor output",
                        lambda: dist.all_gather_into_tensor(out.conj(), t))]:
        expect_raises(RuntimeError, "conjugat", call, f"{what} on a conjugate view ({dtype})")
    resolved = t.conj().resolve_conj()  # the way out that the message names
    dist.all_reduce(resolved)
    check(resolved, torch.complex(torch.full((3,), world, dtype=real),
                                  torch.full((3,), -world, dtype=real)),
          f"all_reduce of a resolved conjugate ({dtype})")


def case_torch_reduce_op(dist: Any, rank: int, world: int) -> None:
    """torch.distributed.ReduceOp values are accepted too."""
    import torch.distributed as td

    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        xs = [gen(data_kind(op), torch.float32, (9,), r) for r in range(world)]
        t = xs[rank].clone()
        dist.all_reduce(t, op=getattr(td.ReduceOp, op))
        check(t, reduce_ref(xs, op), f"all_reduce with torch.distributed.ReduceOp.{op}")


# ---------------------------------------------------------------------------------------------
# Point to point

P2P_SHAPES: list[tuple[int, ...]] = [(0,), (1,), (1001,), (2, 3), (300_000,)]


def _p2p_data(dtype: str, shape: tuple[int, ...], sender: int, receiver: int, i: int) -> torch.Tensor:
    return gen("any", DTYPES[dtype], shape, sender, seed=100 * i + receiver)


def case_send_recv_ring(dist: Any, rank: int, world: int, dtype: str) -> None:
    """Blocking send to the right neighbour, recv from the left one (even ranks send first)."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for i, shape in enumerate(P2P_SHAPES):
        mine = _p2p_data(dtype, shape, rank, right, i)
        got = torch.zeros(shape, dtype=DTYPES[dtype])
        if rank % 2 == 0:
            dist.send(mine, dst=right)
            src = dist.recv(got, src=left)
        else:
            src = dist.recv(got, src=left)
            dist.send(mine, dst=right)
        assert src == left, f"recv(src={left}) returned {src}"
        check(got, _p2p_data(dtype, shape, left, rank, i), f"ring recv {dtype} shape {shape} on rank {rank} from {left}")
        check(mine, _p2p_data(dtype, shape, rank, right, i), "send must not modify its tensor")


def case_send_recv_pairwise(dist: Any, rank: int, world: int, dtype: str) -> None:
    """Every pair (i < j) exchanges with blocking calls, in lexicographic pair order."""
    for i, shape in enumerate(P2P_SHAPES):
        for a in range(world):
            for b in range(a + 1, world):
                if rank not in (a, b):
                    continue
                peer = b if rank == a else a
                got = torch.zeros(shape, dtype=DTYPES[dtype])
                if rank == a:
                    dist.send(_p2p_data(dtype, shape, rank, peer, i), peer)
                    dist.recv(got, peer)
                else:
                    dist.recv(got, peer)
                    dist.send(_p2p_data(dtype, shape, rank, peer, i), peer)
                check(got, _p2p_data(dtype, shape, peer, rank, i), f"pairwise {dtype} shape {shape}: rank {rank} from {peer}")


def case_isend_irecv_ring(dist: Any, rank: int, world: int, dtype: str) -> None:
    right, left = (rank + 1) % world, (rank - 1) % world
    for i, shape in enumerate(P2P_SHAPES):
        got = torch.zeros(shape, dtype=DTYPES[dtype])
        rw = dist.irecv(got, src=left)
        sw = dist.isend(_p2p_data(dtype, shape, rank, right, i), dst=right)
        assert sw.wait() is True and rw.wait() is True
        assert rw.is_completed() and sw.is_completed()
        check(got, _p2p_data(dtype, shape, left, rank, i), f"isend/irecv ring {dtype} shape {shape} rank {rank}")


def case_isend_irecv_pairwise(dist: Any, rank: int, world: int, dtype: str) -> None:
    """Every rank posts irecv from and isend to every other rank at once, then waits all (in
    reverse order)."""
    for i, shape in enumerate(P2P_SHAPES):
        got = {p: torch.zeros(shape, dtype=DTYPES[dtype]) for p in range(world) if p != rank}
        works = []
        for p in got:
            works.append(dist.irecv(got[p], src=p))
            works.append(dist.isend(_p2p_data(dtype, shape, rank, p, i), dst=p))
        for w in reversed(works):
            w.wait()
        for p, t in got.items():
            check(t, _p2p_data(dtype, shape, p, rank, i), f"isend/irecv pairwise {dtype} shape {shape}: rank {rank} from {p}")


def case_recv_any_source(dist: Any, rank: int, world: int) -> None:
    """recv(src=None) returns the sender's rank; recv(src=k) returns k."""
    if rank == 0:
        seen = []
        for _ in range(world - 1):
            t = torch.zeros(4, dtype=torch.int64)
            src = dist.recv(t)
            assert src in range(1, world), f"recv() returned {src!r}"
            check(t, torch.full((4,), src, dtype=torch.int64), f"recv() returned {src} but the data came from rank {t[0].item()}")
            seen.append(src)
        assert sorted(seen) == list(range(1, world)), f"senders seen {seen}"
        dist.barrier()  # the second messages are sent only now, so recv() above matched firsts
        for k in range(world - 1, 0, -1):
            t = torch.zeros(4, dtype=torch.int64)
            assert dist.recv(t, src=k) == k
            check(t, torch.full((4,), 10 + k, dtype=torch.int64), f"recv(src={k})")
    else:
        dist.send(torch.full((4,), rank, dtype=torch.int64), dst=0)
        dist.barrier()
        dist.send(torch.full((4,), 10 + rank, dtype=torch.int64), dst=0)


def case_tags(dist: Any, rank: int, world: int) -> None:
    """Messages match by tag: rank 1 sends tags 5 then 7, rank 0 receives 7 first."""
    if rank == 1:
        a = dist.isend(torch.full((3,), 5.0), dst=0, tag=5)
        b = dist.isend(torch.full((3,), 7.0), dst=0, tag=7)
        a.wait()
        b.wait()
    elif rank == 0:
        t7, t5 = torch.zeros(3), torch.zeros(3)
        dist.recv(t7, src=1, tag=7)
        dist.recv(t5, src=1, tag=5)
        check(t7, torch.full((3,), 7.0), "recv tag 7")
        check(t5, torch.full((3,), 5.0), "recv tag 5")
    dist.barrier()


# ---------------------------------------------------------------------------------------------
# Async work


def case_async_ops(dist: Any, rank: int, world: int) -> None:
    """async_op=True returns a Work: wait() is True, then is_completed() and is_success()."""
    xs = [gen("sum", torch.float32, (1001,), r) for r in range(world)]

    def done(w: Any, what: str) -> None:
        assert w is not None, f"{what}(async_op=True) returned None"
        assert w.wait() is True, f"{what}: wait() did not return True"
        if ctx.mode == "torch" and what == "reduce_scatter_tensor":
            return  # gloo's reduce_scatter Work reports is_completed() False even after wait()
        assert w.is_completed(), f"{what}: is_completed() False after wait()"
        assert w.is_success(), f"{what}: is_success() False after wait()"

    t = xs[rank].clone()
    done(dist.all_reduce(t, async_op=True), "all_reduce")
    check(t, reduce_ref(xs, "SUM"), "async all_reduce")
    t = xs[rank].clone()
    done(dist.broadcast(t, src=world - 1, async_op=True), "broadcast")
    check(t, xs[world - 1], "async broadcast")
    out = [torch.zeros(1001) for _ in range(world)]
    done(dist.all_gather(out, xs[rank], async_op=True), "all_gather")
    check(torch.stack(out), torch.stack(xs), "async all_gather")
    flat = torch.zeros(world * 1001)
    done(dist.all_gather_into_tensor(flat, xs[rank], async_op=True), "all_gather_into_tensor")
    check(flat, torch.cat(xs), "async all_gather_into_tensor")
    out1 = torch.zeros(7)
    inputs = [gen("sum", torch.float32, (world * 7,), r, seed=3) for r in range(world)]
    done(dist.reduce_scatter_tensor(out1, inputs[rank], async_op=True), "reduce_scatter_tensor")
    check(out1, reduce_ref([x[rank * 7:(rank + 1) * 7] for x in inputs], "SUM"), "async reduce_scatter_tensor")
    done(dist.barrier(async_op=True), "barrier")


def case_async_future(dist: Any, rank: int, world: int) -> None:
    """get_future().wait() gives the op's output tensors; .then() chains on them."""
    xs = [gen("sum", torch.float64, (33,), r) for r in range(world)]
    expected = reduce_ref(xs, "SUM")
    t = xs[rank].clone()
    w = dist.all_reduce(t, async_op=True)
    chained = w.get_future().then(lambda f: f.value()[0] * 2)  # registered before completion
    value = w.get_future().wait()
    assert isinstance(value, list) and len(value) == 1, f"all_reduce future value {value!r}"
    check(value[0], expected, "all_reduce get_future().wait()[0]")
    check(chained.wait(), expected * 2, "all_reduce get_future().then(x2)")
    check(w.get_future().then(lambda f: f.value()[0] + 1).wait(), expected + 1, "then() after completion")
    check(t, expected, "all_reduce tensor after the future")

    out = [torch.zeros(33, dtype=torch.float64) for _ in range(world)]
    w = dist.all_gather(out, xs[rank], async_op=True)
    value = w.get_future().wait()
    assert isinstance(value, list) and len(value) == world, f"all_gather future value {value!r}"
    for r in range(world):
        check(value[r], xs[r], f"all_gather future value[{r}]")

    t = xs[rank].clone()
    w = dist.broadcast(t, src=0, async_op=True)
    total = w.get_future().then(lambda f: f.value()[0].sum().item()).wait()
    assert total == xs[0].sum().item(), f"broadcast future then(): {total} != {xs[0].sum().item()}"


def case_async_reverse(dist: Any, rank: int, world: int, n: int = 6) -> None:
    """Several async ops in flight, waited in reverse order, each with its own correct result."""
    xs = [[gen("sum", torch.float32, (1000 + 37 * k,), r, seed=k) for r in range(world)] for k in range(n)]
    ts = [xs[k][rank].clone() for k in range(n)]
    works = [dist.all_reduce(ts[k], async_op=True) for k in range(n)]
    b = gen("any", torch.int64, (77,), rank, seed=9)
    works.append(dist.broadcast(b, src=world - 1, async_op=True))
    gathered = torch.zeros(world * 5, dtype=torch.int32)
    works.append(dist.all_gather_into_tensor(gathered, torch.full((5,), rank, dtype=torch.int32), async_op=True))
    for w in reversed(works):
        assert w.wait() is True
    for w in works:
        assert w.is_completed() and w.is_success()
    for k in range(n):
        check(ts[k], reduce_ref(xs[k], "SUM"), f"async all_reduce #{k} waited in reverse order")
    check(b, gen("any", torch.int64, (77,), world - 1, seed=9), "async broadcast waited first")
    check(gathered, torch.arange(world, dtype=torch.int32).repeat_interleave(5), "async all_gather_into_tensor")


# ---------------------------------------------------------------------------------------------
# Initialisation (run in worlds started without init_process_group)


def case_uninitialized(dist: Any, rank: int, world: int) -> None:
    """Before init_process_group: is_initialized() is False, the rest raises ValueError."""
    assert dist.is_available()
    assert dist.is_initialized() is False
    pat = r"not been initialized|init_process_group"
    expect_raises(ValueError, pat, lambda: dist.get_rank(), "get_rank() before init")
    expect_raises(ValueError, pat, lambda: dist.get_world_size(), "get_world_size() before init")
    expect_raises(ValueError, pat, lambda: dist.all_reduce(torch.ones(2)), "all_reduce before init")
    expect_raises(ValueError, pat, lambda: dist.broadcast(torch.ones(2), src=0), "broadcast before init")
    expect_raises(ValueError, pat, lambda: dist.barrier(), "barrier before init")
    expect_raises(ValueError, pat, lambda: dist.send(torch.ones(2), dst=0), "send before init")


def _init(dist: Any, rank: int, world: int, method: str, port: int, path: str, backend: Optional[str]) -> Any:
    """init_process_group by `method`; returns the store object it created (kept alive)."""
    import torch.distributed as td

    timeout = timedelta(seconds=30)
    store: Any = None
    master = os.environ["MASTER_ADDR"]  # 127.0.0.1, or host 0's address on test hosts
    if method == "env":
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
    elif method == "env_default":  # no init_method, no rank/world_size: all from the environment
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group(backend, timeout=timeout)
    elif method == "tcp":
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank,
                                world_size=world, timeout=timeout)
    elif method == "file":
        dist.init_process_group(backend, init_method=f"file://{path}", rank=rank, world_size=world,
                                timeout=timeout)
    elif method in ("store_tcp", "store_torch_tcp"):
        mod = dist if method == "store_tcp" else td
        store = mod.TCPStore(master, port, world, rank == 0, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    elif method == "store_file":
        store = dist.FileStore(path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    elif method == "store_hash":  # world 1 only: a HashStore lives in one process
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        raise ValueError(method)
    return store


def case_one_world(dist: Any, rank: int, world: int) -> None:
    """After rustdist's init, torch.distributed sees the same world (rustdist-only): torch's
    default group is rustdist's, rustdist.new_group makes torch groups, torch's own
    collectives and torch APIs with no group= run on rustdist's engine."""
    import torch.distributed as td

    assert td.is_initialized() and td.group.WORLD is dist.group.WORLD, td.group.WORLD
    assert td.get_backend() == "rustdist" and td.get_rank() == rank and td.get_world_size() == world
    assert isinstance(td.group.WORLD, dist.ProcessGroup)
    t = torch.full((5,), float(rank + 1))
    td.all_reduce(t)
    check(t, torch.full((5,), float(world * (world + 1) // 2)), "torch.distributed.all_reduce")
    members = list(range(0, world, 2))
    g = dist.new_group(members)
    if rank in members:
        assert isinstance(g, dist.ProcessGroup) and td.get_process_group_ranks(g) == members
        t = torch.ones(2)
        td.all_reduce(t, group=g)
        check(t, torch.full((2,), float(len(members))), "torch all_reduce on rustdist.new_group")
        dist.destroy_process_group(g)
    else:
        assert g == td.GroupMember.NON_GROUP_MEMBER, g
    mesh = dist.init_device_mesh("cpu", (world,))
    assert mesh.get_group() is dist.group.WORLD or isinstance(mesh.get_group(), dist.ProcessGroup)


def case_init_and_destroy(dist: Any, rank: int, world: int, method: str, ports: Sequence[int],
                          paths: Sequence[str], backend: Optional[str] = "default") -> None:
    """For each (port, path): init by `method`, check the world, run collectives, destroy."""
    be = ctx.backend if backend == "default" else backend
    for round_, (port, path) in enumerate(zip(ports, paths)):
        what = f"{method} init round {round_}"
        assert not dist.is_initialized(), f"{what}: is_initialized() before init"
        store = _init(dist, rank, world, method, port, path, be)
        assert dist.is_initialized() is True, f"{what}: is_initialized() after init"
        assert dist.get_rank() == rank, f"{what}: get_rank() {dist.get_rank()} != {rank}"
        assert dist.get_world_size() == world, f"{what}: get_world_size() {dist.get_world_size()}"
        got_backend = dist.get_backend()
        assert isinstance(got_backend, str) and got_backend, f"{what}: get_backend() {got_backend!r}"
        if be is not None:
            assert got_backend == be, f"{what}: get_backend() {got_backend!r} != {be!r}"
        t = torch.full((10,), rank + 1, dtype=torch.int64)
        dist.all_reduce(t)
        check(t, torch.full((10,), world * (world + 1) // 2, dtype=torch.int64), f"{what}: all_reduce")
        t = torch.full((3,), float(rank))
        dist.broadcast(t, src=world - 1)
        check(t, torch.full((3,), float(world - 1)), f"{what}: broadcast")
        dist.barrier()
        dist.destroy_process_group()
        assert dist.is_initialized() is False, f"{what}: is_initialized() after destroy_process_group()"
        del store
    expect_raises(ValueError, r"not been initialized|init_process_group", lambda: dist.get_rank(),
                  "get_rank() after destroy_process_group()")


# ---------------------------------------------------------------------------------------------
# Bad inputs (every rank makes the same bad call; the group must stay usable)

ANY_ERROR = (ValueError, TypeError, RuntimeError)


def case_bad_root(dist: Any, rank: int, world: int) -> None:
    for src in (world, world + 3, -1):
        expect_raises((ValueError, RuntimeError), rf"rank.*{src}|{src}.*rank|src",
                      lambda: dist.broadcast(torch.ones(3), src=src), f"broadcast(src={src}) at world {world}")
    sanity(dist, world)


def case_bad_peer(dist: Any, rank: int, world: int) -> None:
    """send/recv to an out-of-range rank (gloo crashes here: rustdist-only)."""
    for peer in (world, world + 5, -1):
        expect_raises((ValueError, RuntimeError), rf"rank.*{peer}|{peer}.*rank|dst|src|destination|source",
                      lambda: dist.send(torch.ones(3), dst=peer), f"send(dst={peer}) at world {world}")
        expect_raises((ValueError, RuntimeError), rf"rank.*{peer}|{peer}.*rank|dst|src|destination|source",
                      lambda: dist.recv(torch.ones(3), src=peer), f"recv(src={peer}) at world {world}")
    sanity(dist, world)


def case_send_to_self(dist: Any, rank: int, world: int) -> None:
    """A blocking send to oneself raises as torch does (it could never complete); a receive
    from oneself matches an earlier isend to oneself (gloo: "Pair is not connected")."""
    expect_raises(ValueError, r"destination rank|same as the rank",
                  lambda: dist.send(torch.ones(3), dst=rank), "send(dst=own rank)")
    if ctx.backend == "gloo":
        expect_raises((ValueError, RuntimeError), r"not connected",
                      lambda: dist.recv(torch.ones(3), src=rank), "recv(src=own rank)")
    else:
        sent = torch.arange(3.0) + rank
        work = dist.isend(sent, dst=rank)
        got = torch.zeros(3)
        assert dist.recv(got, src=rank) == rank, "recv(src=own rank) must return the own rank"
        work.wait()
        check(got, sent, "recv from own isend")
    sanity(dist, world)


def case_bad_all_gather_list(dist: Any, rank: int, world: int) -> None:
    x = torch.ones(4)
    for n in (world - 1, world + 1):  # torch's types and texts (gloo's checks)
        out = [torch.zeros(4) for _ in range(n)]
        expect_raises(RuntimeError, r"invalid output tensor list",
                      lambda: dist.all_gather(out, x), f"all_gather with a list of {n} tensors at world {world}")
    out = [torch.zeros(5) for _ in range(world)]
    expect_raises(RuntimeError, r"invalid tensor size",
                  lambda: dist.all_gather(out, x), "all_gather into tensors of 5 elements from 4")
    sanity(dist, world)


def case_bad_output_size(dist: Any, rank: int, world: int) -> None:
    """Output tensors of the wrong size, and all_to_all_single tensors whose dimension 0 does
    not split into equal blocks (gloo aborts the process here: rustdist-only)."""
    pat = r"size|numel|element|shape"
    x = torch.ones(4)
    for n in (world * 4 - 1, world * 4 + 4):
        expect_raises((ValueError, RuntimeError), pat, lambda: dist.all_gather_into_tensor(torch.zeros(n), x),
                      f"all_gather_into_tensor into {n} elements at world {world} from 4")
    expect_raises((ValueError, RuntimeError), pat,
                  lambda: dist.all_gather_into_tensor(torch.zeros(world + 1, 4), x),
                  f"all_gather_into_tensor into shape ({world + 1}, 4)")
    for n in (3, 5):
        expect_raises((ValueError, RuntimeError), pat,
                      lambda: dist.reduce_scatter_tensor(torch.zeros(n), torch.ones(world * 4)),
                      f"reduce_scatter_tensor of {world * 4} elements into {n}")
    if world > 1:
        expect_raises((ValueError, RuntimeError), pat,
                      lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(world * 4 + 1)),
                      f"reduce_scatter_tensor of {world * 4 + 1} elements into 4")
    expect_raises((ValueError, RuntimeError), r"dtype|type",
                  lambda: dist.all_gather_into_tensor(torch.zeros(world * 4, dtype=torch.float64), x),
                  "all_gather_into_tensor float32 into float64")
    if world > 1:
        for shape in ((world + 1, 2), (world + 1,), ()):
            expect_raises(RuntimeError, r"divisible",
                          lambda: dist.all_to_all_single(torch.zeros(shape), torch.ones(shape)),
                          f"all_to_all_single of shape {shape} at world {world}")
    expect_raises((ValueError, RuntimeError), r"dtype|type",
                  lambda: dist.all_to_all_single(torch.zeros(world * 2, dtype=torch.float64),
                                                 torch.ones(world * 2)),
                  "all_to_all_single float32 into float64")
    sanity(dist, world)


def case_non_contiguous(dist: Any, rank: int, world: int) -> None:
    nc = torch.ones(4, 6).t()
    assert not nc.is_contiguous()
    pat = r"^Tensors must be contiguous"  # torch's ValueError where its backends check
    expect_raises(ValueError, pat, lambda: dist.all_reduce(nc), "all_reduce(non-contiguous)")
    expect_raises(ValueError, pat, lambda: dist.broadcast(nc, src=0), "broadcast(non-contiguous)")
    expect_raises(ValueError, pat,
                  lambda: dist.all_gather_into_tensor(torch.zeros(world * 24), nc),
                  "all_gather_into_tensor(non-contiguous input)")
    expect_raises(ValueError, pat,
                  lambda: dist.all_gather_into_tensor(torch.zeros(world * 6, 4).t(), torch.ones(6, 4)),
                  "all_gather_into_tensor(non-contiguous output)")
    expect_raises(ValueError, pat,
                  lambda: dist.reduce_scatter_tensor(torch.zeros(6, 4).t(), torch.ones(world * 24)),
                  "reduce_scatter_tensor(non-contiguous output)")
    sanity(dist, world)


def case_unsupported_dtype(dist: Any, rank: int, world: int) -> None:
    """uint32 and float8 tensors are not supported by either backend."""
    for dt in (torch.uint32, torch.float8_e4m3fn):
        name = str(dt).replace("torch.", "")
        # gloo says only "Invalid scalar type"; rustdist must name the dtype.
        pat = "Invalid scalar type" if ctx.mode == "torch" else name
        expect_raises((TypeError, RuntimeError), pat, lambda: dist.all_reduce(torch.zeros(4, dtype=dt)),
                      f"all_reduce({name})")
        expect_raises((TypeError, RuntimeError), pat, lambda: dist.broadcast(torch.zeros(4, dtype=dt), src=0),
                      f"broadcast({name})")
    sanity(dist, world)


def case_unsupported_op(dist: Any, rank: int, world: int) -> None:
    """Bitwise ops on floats and MIN/MAX/PRODUCT on complex tensors are rejected."""
    for op in ("BAND", "BOR", "BXOR"):
        expect_raises((ValueError, TypeError, RuntimeError), op,
                      lambda: dist.all_reduce(torch.ones(4), op=rop(dist, op)), f"all_reduce({op}, float32)")
    sanity(dist, world)


def case_complex_unsupported_op(dist: Any, rank: int, world: int) -> None:
    for op in ("MIN", "MAX"):
        expect_raises((ValueError, RuntimeError), op,
                      lambda: dist.all_reduce(torch.ones(4, dtype=torch.complex64), op=rop(dist, op)),
                      f"all_reduce({op}, complex64)")
    sanity(dist, world)


def case_not_a_tensor(dist: Any, rank: int, world: int) -> None:
    expect_raises(TypeError, r"tensor|ndarray", lambda: dist.all_reduce([1.0, 2.0]), "all_reduce(list)")
    expect_raises(TypeError, r"tensor|ndarray", lambda: dist.broadcast(3.0, src=0), "broadcast(float)")
    sanity(dist, world)


def case_bitwise_ops(dist: Any, rank: int, world: int, dtype: str) -> None:
    """BAND/BOR/BXOR on integer and bool tensors."""
    dt = DTYPES[dtype]
    xs = [gen("any", dt, (1001,), r) for r in range(world)]
    for op, fn in (("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or), ("BXOR", torch.bitwise_xor)):
        t = xs[rank].clone()
        dist.all_reduce(t, op=rop(dist, op))
        expected = xs[0].clone()
        for x in xs[1:]:
            expected = fn(expected, x)
        check(t, expected, f"all_reduce {op} {dtype}")


# ---------------------------------------------------------------------------------------------
# numpy inputs (rustdist only: torch.distributed takes tensors only)

NP_DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.numpy().copy()


def case_numpy(dist: Any, rank: int, world: int) -> None:
    for dtype in NP_DTYPES:
        dt = DTYPES[dtype]
        for i, shape in enumerate([(0,), (7,), (2, 3), (100_001,)]):
            for op in ("SUM", "MAX"):
                xs = [gen(data_kind(op), dt, shape, r, seed=i) for r in range(world)]
                a = _np(xs[rank])
                assert dist.all_reduce(a, op=rop(dist, op)) is None
                assert isinstance(a, np.ndarray)
                check(a, reduce_ref(xs, op), f"numpy all_reduce {op} {dtype} shape {shape}")
            xs = [gen("any", dt, shape, r, seed=i) for r in range(world)]
            a = _np(xs[rank])
            dist.broadcast(a, src=world - 1)
            check(a, xs[world - 1], f"numpy broadcast {dtype} shape {shape}")
            out = np.zeros((world * shape[0],) + shape[1:], dtype=a.dtype)
            dist.all_gather_into_tensor(out, _np(xs[rank]))
            check(out, torch.cat(xs), f"numpy all_gather_into_tensor {dtype} shape {shape}")
            outs = [np.zeros(shape, dtype=a.dtype) for _ in range(world)]
            dist.all_gather(outs, _np(xs[rank]))
            for r in range(world):
                check(outs[r], xs[r], f"numpy all_gather {dtype} shape {shape} block {r}")
            blocks = [[gen("sum", dt, shape, r, seed=10 * i + b) for b in range(world)] for r in range(world)]
            o = np.zeros(shape, dtype=a.dtype)
            dist.reduce_scatter_tensor(o, _np(torch.cat(blocks[rank])))
            check(o, reduce_ref([blocks[r][rank] for r in range(world)], "SUM"),
                  f"numpy reduce_scatter_tensor {dtype} shape {shape}")
            if world > 1:
                right, left = (rank + 1) % world, (rank - 1) % world
                got = np.zeros(shape, dtype=a.dtype)
                rw = dist.irecv(got, src=left)
                dist.isend(_np(_p2p_data(dtype, shape, rank, right, i)), dst=right).wait()
                rw.wait()
                check(got, _p2p_data(dtype, shape, left, rank, i), f"numpy isend/irecv {dtype} shape {shape}")
    # A non-contiguous array is rejected like a non-contiguous tensor.
    nc = np.ones((4, 6), dtype=np.float32).T
    expect_raises((ValueError, RuntimeError), "contiguous", lambda: dist.all_reduce(nc), "all_reduce(non-contiguous ndarray)")
    sanity(dist, world)


# ---------------------------------------------------------------------------------------------
# Failures (rustdist only, each in its own short-lived world)


def case_exit(dist: Any, rank: int, world: int) -> None:
    """Dies at once, as a crashed peer would."""
    os._exit(1)


def case_warmup(dist: Any, rank: int, world: int) -> None:
    """One successful collective, so that connections are established."""
    sanity(dist, world)


def case_blocked_until_peer_dies(dist: Any, rank: int, world: int, victim: int) -> dict[str, Any]:
    """Tells the driver it is about to enter all_reduce (the driver then kills `victim`), then
    blocks in it; returns when and how it failed. A second op must fail at once too."""
    ctx.notify("entering")
    t = torch.ones(100_000)
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - the driver checks the type
        t_err = time.monotonic()
        err: BaseException = e
    else:
        raise AssertionError(f"rank {rank}: all_reduce returned normally although rank {victim} died")
    t1 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        second = None
    except Exception as e:  # noqa: BLE001
        second = e
    return {"t_err": t_err, "type": type(err).__name__, "network": isinstance(err, dist.DistNetworkError),
            "msg": str(err), "second": None if second is None else f"{type(second).__name__}: {second}",
            "second_s": time.monotonic() - t1}


def case_collective_after_peer_died(dist: Any, rank: int, world: int, victim: int, bound: float) -> None:
    """`victim` has exited; a new collective must raise DistNetworkError naming it, fast."""
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
    except dist.DistNetworkError as e:
        elapsed = time.monotonic() - t0
        assert f"rank {victim}" in str(e), f"DistNetworkError does not name rank {victim}: {e}"
        assert elapsed < bound, f"DistNetworkError after {elapsed:.2f} s (bound {bound} s)"
        return
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected DistNetworkError naming rank {victim}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"all_reduce returned normally although rank {victim} died")


def case_mismatch(dist: Any, rank: int, world: int, kind: str) -> None:
    """Rank 0 calls something different from the others; every rank must raise (at the call
    or at the following barrier) naming what differs."""
    odd = rank == 0
    if kind == "size":
        call = lambda: dist.all_reduce(torch.ones(8 if odd else 16))  # noqa: E731
        pat = r"size|count|numel|element|length|bytes"
    elif kind == "dtype":
        call = lambda: dist.all_reduce(torch.ones(8, dtype=torch.float32 if odd else torch.int32))  # noqa: E731
        pat = r"dtype|float32|int32"
    elif kind == "op":
        call = lambda: dist.all_reduce(torch.ones(8), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)  # noqa: E731
        pat = r"MAX.*SUM|SUM.*MAX|reduce op|\bop\b"
    elif kind == "collective":
        call = (lambda: dist.all_reduce(torch.ones(8))) if odd else (lambda: dist.broadcast(torch.ones(8), src=0))
        pat = r"all_reduce.*broadcast|broadcast.*all_reduce"
    else:
        raise ValueError(kind)
    err: Optional[BaseException] = None
    where = "the mismatched call"
    try:
        call()
    except RuntimeError as e:
        err = e
    if err is None:
        where = "the following barrier"
        try:
            dist.barrier()
        except RuntimeError as e:
            err = e
    assert err is not None, f"rank {rank}: mismatched {kind} went unnoticed (call and barrier returned)"
    assert re.search(pat, str(err), re.IGNORECASE | re.DOTALL), (
        f"rank {rank}: {type(err).__name__} at {where} does not name the {kind} mismatch "
        f"(pattern {pat!r}): {err}")


def case_group_timeout(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """Rank 0 only: a synchronous all_reduce no peer joins, in a group with a short timeout,
    raises in the words torch's tests and log scrapers look for (torch's
    test_barrier_timeout_full_group matches `` (Timed out|closed|timeout) ``)."""
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
    except RuntimeError as e:
        err = e
    else:
        raise AssertionError("all_reduce returned although no peer joined")
    assert re.search(" (Timed out|closed|timeout) ", str(err)), str(err)
    return {"type": type(err).__name__, "msg": str(err), "elapsed": time.monotonic() - t0}


def case_wait_timeout(dist: Any, rank: int, world: int) -> dict[str, Any]:
    """Rank 0 only: an all_reduce no peer joins; wait(timeout=0.5 s) raises; the Work is then
    neither completed nor successful."""
    w = dist.all_reduce(torch.ones(10), async_op=True)
    t0 = time.monotonic()
    try:
        w.wait(timeout=timedelta(seconds=0.5))
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        err = e
    else:
        raise AssertionError("wait(timeout=0.5 s) returned although no peer joined the all_reduce")
    assert 0.4 <= elapsed < 3.0, f"wait(timeout=0.5 s) raised after {elapsed:.2f} s"
    assert w.is_completed() is False, "is_completed() True after wait() timed out"
    assert w.is_success() is False, "is_success() True after wait() timed out"
    return {"type": type(err).__name__, "msg": str(err)}
