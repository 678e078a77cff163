"""Cases for the torch.distributed API surface (issue 3), run inside the rank processes.

The driver names them ``"api_cases:<name>"`` (see harness.find_case); every case is
``case_<name>(dist, rank, world, **params)`` like those of dist_cases, and reuses its data
generators and checks: data is exact in every dtype, so results are compared bit for bit
(AVG at world sizes that are not powers of two within a few ulps).

Expected values come from torch.distributed's documentation (the examples with stated outputs
are reproduced literally in the ``*_doc_example`` cases) and are validated against gloo with
``RUSTDIST_TEST_DIST=torch`` wherever gloo supports the call.
"""

from __future__ import annotations

import os
import re
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from dist_cases import DTYPES, check, data_kind, expect_raises, gen, reduce_ref, rop, sanity
from harness import ctx, init_env

COMPLEX: dict[str, torch.dtype] = {"complex64": torch.complex64, "complex128": torch.complex128}
ALL_DTYPES: dict[str, torch.dtype] = {**DTYPES, **COMPLEX}
REAL_OF: dict[torch.dtype, torch.dtype] = {torch.complex64: torch.float32,
                                           torch.complex128: torch.float64}
FLOATS = ["float32", "float64", "float16", "bfloat16"]
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
#: Ops torch.distributed rejects on complex tensors (supports_complex(): ValueError).
COMPLEX_DENIED = ["PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
PREMUL_FACTOR = 2.0
#: Names a dtype may go by in an error message.
DTYPE_NAMES: dict[str, str] = {
    "float32": r"float32|\bfloat\b", "float64": r"float64|double", "float16": r"float16|half",
    "bfloat16": "bfloat16", "int8": "int8", "int16": r"int16|short", "int32": r"int32|\bint\b",
    "int64": r"int64|long", "uint8": r"uint8|byte", "bool": "bool", "complex64": r"complex",
    "complex128": r"complex",
}
IS_TORCH = ctx.mode == "torch"


def dtypes_for(names: Sequence[str]) -> list[str]:
    """`names` minus int16 under gloo (gloo has no int16 collectives)."""
    return [d for d in names if not (IS_TORCH and d == "int16")]


def cgen(kind: str, dt: torch.dtype, shape: Sequence[int], rank: int, seed: int = 0) -> torch.Tensor:
    """gen() for every dtype: complex tensors get exact real and imaginary parts."""
    if dt.is_complex:
        real = REAL_OF[dt]
        return torch.complex(gen(kind, real, shape, rank, seed), gen(kind, real, shape, rank, seed + 7777))
    return gen(kind, dt, shape, rank, seed)


def op_of(dist: Any, op: str) -> Any:
    """dist.ReduceOp.<op>, or the premul-sum op with factor 2 for "PREMUL_SUM"."""
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return rop(dist, op)


def ref(xs: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction of `xs` over ranks for every op and dtype (reduce_ref plus complex, the
    bitwise ops and PREMUL_SUM)."""
    dt = xs[0].dtype
    if op in BITWISE:
        out = xs[0].clone()
        for x in xs[1:]:
            out = BITWISE[op](out, x)
        return out
    if op == "PREMUL_SUM":
        if dt.is_complex:
            return torch.stack(list(xs)).sum(0) * PREMUL_FACTOR
        return (torch.stack(list(xs)).double().sum(0) * PREMUL_FACTOR).to(dt)
    if dt.is_complex:
        st = torch.stack(list(xs))
        if op == "SUM":
            return st.sum(0)
        if op == "AVG":
            return (st.to(torch.complex128).sum(0) / len(xs)).to(dt)
        raise ValueError(op)
    return reduce_ref(xs, op)


def tol_op(op: str) -> str:
    return "AVG" if op == "AVG" else "SUM"


def kind_of(op: str) -> str:
    return "sum" if op == "PREMUL_SUM" else data_kind(op)


def same(a: Any, b: Any) -> bool:
    """Deep equality for objects that may contain tensors or numpy arrays."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a))
    return type(a) is type(b) and a == b


def obj(rank: int, seed: int = 0) -> Any:
    """A picklable object particular to (rank, seed): nested containers, a tensor, an ndarray,
    unicode, None, and for seed 1 a 300 kB payload."""
    o: dict[Any, Any] = {
        "rank": rank, "seed": seed, "name": f"rank-{rank}-é✓", (rank, seed): [None, 1.5, True],
        "t": torch.arange(rank + 3, dtype=torch.float64) * (seed + 1),
        "a": np.full((2, rank + 1), rank, dtype=np.int16),
    }
    if seed == 1:
        o["blob"] = bytes([rank % 256]) * 300_000
    return o


def done(w: Any, what: str) -> None:
    """An async_op=True call returned a Work whose wait() succeeds."""
    assert w is not None, f"{what}(async_op=True) returned None"
    w.wait()


# ---------------------------------------------------------------------------------------------
# reduce, gather, scatter

SHAPES: list[tuple[int, ...]] = [(0,), (1,), (7,), (2, 3), (1001,), (100_003,)]
COLL_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def case_reduce(dist: Any, rank: int, world: int, op: str, dst: int) -> None:
    """reduce(): only `dst` is guaranteed to hold the result (other ranks' tensors are
    scratch, so they are not checked)."""
    for dtype in dtypes_for(COLL_DTYPES if op != "AVG" else FLOATS):
        dt = DTYPES[dtype]
        for i, shape in enumerate(SHAPES):
            xs = [gen(data_kind(op), dt, shape, r, seed=i) for r in range(world)]
            t = xs[rank].clone()
            assert dist.reduce(t, dst=dst, op=rop(dist, op)) is None
            if rank == dst:
                check(t, reduce_ref(xs, op), f"reduce {op} {dtype} shape {shape} dst {dst}", op)
    xs = [gen("sum", torch.float32, (33,), r, seed=99) for r in range(world)]
    t = xs[rank].clone()
    done(dist.reduce(t, dst=dst, async_op=True), "reduce")
    if rank == dst:
        check(t, reduce_ref(xs, "SUM"), f"async reduce dst {dst}")


def case_gather(dist: Any, rank: int, world: int, dst: int) -> None:
    """gather(): `dst` receives every rank's tensor in gather_list (None elsewhere). gloo has
    no complex gather ("Invalid scalar type"), so torch mode leaves complex out."""
    for dtype in dtypes_for(list(DTYPES) if IS_TORCH else list(ALL_DTYPES)):
        dt = ALL_DTYPES[dtype]
        for i, shape in enumerate(SHAPES):
            xs = [cgen("any", dt, shape, r, seed=i) for r in range(world)]
            out = [torch.zeros(shape, dtype=dt) for _ in range(world)] if rank == dst else None
            mine = xs[rank].clone()
            assert dist.gather(mine, out, dst=dst) is None
            check(mine, xs[rank], "gather must not modify its input")
            if rank == dst:
                for r in range(world):
                    check(out[r], xs[r], f"gather {dtype} shape {shape} dst {dst}: block of rank {r}")
    out = [torch.zeros(5) for _ in range(world)] if rank == dst else None
    done(dist.gather(torch.full((5,), float(rank)), out, dst=dst, async_op=True), "gather")
    if rank == dst:
        check(torch.stack(out), torch.arange(world, dtype=torch.float32)[:, None].expand(world, 5),
              "async gather")


def case_scatter(dist: Any, rank: int, world: int, src: int) -> None:
    """scatter(): rank i receives scatter_list[i] of `src` (scatter_list is None elsewhere)."""
    for dtype in dtypes_for(list(ALL_DTYPES)):
        dt = ALL_DTYPES[dtype]
        for i, shape in enumerate(SHAPES):
            blocks = [cgen("any", dt, shape, src, seed=100 * i + r) for r in range(world)]
            out = torch.zeros(shape, dtype=dt)
            lst = [b.clone() for b in blocks] if rank == src else None
            assert dist.scatter(out, lst, src=src) is None
            check(out, blocks[rank], f"scatter {dtype} shape {shape} src {src} on rank {rank}")
    out = torch.zeros(4, dtype=torch.int64)
    lst = [torch.full((4,), 10 * r + src) for r in range(world)] if rank == src else None
    done(dist.scatter(out, lst, src=src, async_op=True), "scatter")
    check(out, torch.full((4,), 10 * rank + src), "async scatter")


def case_gather_scatter_doc_example(dist: Any, rank: int, world: int) -> None:
    """The gather and scatter examples of the docs (world size 2), literally."""
    assert world == 2
    tensor = torch.ones(2) + rank
    gather_list = [torch.zeros_like(tensor) for _ in range(2)] if rank == 0 else None
    dist.gather(tensor, gather_list, dst=0)
    if rank == 0:
        check(torch.stack(gather_list), torch.tensor([[1.0, 1.0], [2.0, 2.0]]), "docs gather example")
    output_tensor = torch.zeros(2)
    scatter_list = [torch.ones(2), torch.ones(2) * 5] if rank == 0 else None
    dist.scatter(output_tensor, scatter_list, src=0)
    check(output_tensor, torch.tensor([[1.0, 1.0], [5.0, 5.0]])[rank], "docs scatter example")


# ---------------------------------------------------------------------------------------------
# all_gather with uneven sizes, reduce_scatter (list form)


def _uneven(r: int) -> int:
    """Rows rank r contributes: 0, 2, 4, 1 for ranks 0-3 (one rank contributes nothing)."""
    return (r * 7) % 5


#: Bytes of data around the sizes between which ranks on one host that may read each other's
#: memory move all_gather, broadcast, all_reduce and all_to_all data in one copy (select.rs;
#: the bands depend on the CPU), and well past them.
LARGE_BYTES = [16 << 10, (256 << 10) - 4 * 4, 256 << 10, (1 << 20) + 4 * 4, 2 << 20,
               (3 << 20) + 4 * 4]


def case_large_transfers(dist: Any, rank: int, world: int) -> None:
    """all_gather_into_tensor, all_gather (lists, uneven too), all_to_all_single of equal
    splits, broadcast and all_reduce at sizes around the single-copy thresholds: every element
    right on every rank, and the inputs untouched."""
    for nbytes in LARGE_BYTES:
        for dt, op in [(torch.float32, "SUM"), (torch.int32, "MAX")]:
            kind = data_kind(op)
            xs = [cgen(kind, dt, (nbytes // 4,), r, seed=nbytes + 4) for r in range(world)]
            buf = xs[rank].clone()
            assert dist.all_reduce(buf, op=op_of(dist, op)) is None
            check(buf, ref(xs, op), f"all_reduce {op} of {nbytes // 4} {dt}", op)
        root = world - 1
        want = cgen("any", torch.float32, (nbytes // 4,), root, seed=nbytes + 3)
        buf = want.clone() if rank == root else torch.zeros_like(want)
        assert dist.broadcast(buf, src=root) is None
        check(buf, want, f"broadcast of {nbytes // 4} float32 from rank {root}")
        n = max(1, nbytes // 4 // world)
        xs = [cgen("any", torch.float32, (n,), r, seed=nbytes) for r in range(world)]
        out = torch.zeros(world * n)
        assert dist.all_gather_into_tensor(out, xs[rank].clone()) is None
        check(out, torch.cat(xs), f"all_gather_into_tensor of {world} x {n} float32")
        mine = cgen("any", torch.float32, (n + rank,), rank, seed=nbytes + 1)
        outs = [torch.zeros(n + r) for r in range(world)]
        assert dist.all_gather(outs, mine) is None
        for r in range(world):
            want = cgen("any", torch.float32, (n + r,), r, seed=nbytes + 1)
            check(outs[r], want, f"uneven all_gather of {n}+r float32: block of rank {r}")
        rows = [cgen("any", torch.float32, (world * n,), r, seed=nbytes + 2) for r in range(world)]
        inp = rows[rank].clone()
        out = torch.zeros(world * n)
        assert dist.all_to_all_single(out, inp) is None
        check(inp, rows[rank], "all_to_all_single must not modify its input")
        want = torch.cat([rows[r][rank * n:(rank + 1) * n] for r in range(world)])
        check(out, want, f"all_to_all_single of {world} x {n} float32")


def case_all_gather_uneven(dist: Any, rank: int, world: int) -> None:
    """all_gather() with a different size per rank ("uneven sized tensors are supported")."""
    for dtype in dtypes_for(["float32", "int64", "bfloat16", "uint8", "bool", "complex64"]):
        dt = ALL_DTYPES[dtype]
        for i, tail in enumerate([(), (3,), (5_001,)]):
            xs = [cgen("any", dt, (_uneven(r), *tail), r, seed=i) for r in range(world)]
            out = [torch.zeros(x.shape, dtype=dt) for x in xs]
            assert dist.all_gather(out, xs[rank]) is None
            for r in range(world):
                check(out[r], xs[r], f"uneven all_gather {dtype} rows {_uneven(r)} x {tail}: block of rank {r}")


def case_reduce_scatter_list(dist: Any, rank: int, world: int, op: str) -> None:
    """reduce_scatter(output, input_list): rank r gets input_list[r] reduced over ranks."""
    for dtype in dtypes_for(COLL_DTYPES if op != "AVG" else FLOATS):
        dt = DTYPES[dtype]
        for i, shape in enumerate([(0,), (1,), (7,), (2, 3), (30_001,)]):
            blocks = [[gen(data_kind(op), dt, shape, r, seed=1000 * i + b) for b in range(world)]
                      for r in range(world)]
            out = torch.zeros(shape, dtype=dt)
            inp = [b.clone() for b in blocks[rank]]
            assert dist.reduce_scatter(out, inp, op=rop(dist, op)) is None
            check(out, reduce_ref([blocks[r][rank] for r in range(world)], op),
                  f"reduce_scatter {op} {dtype} shape {shape} rank {rank}", op)
    out = torch.zeros(3)
    done(dist.reduce_scatter(out, [torch.full((3,), float(r + rank)) for r in range(world)], async_op=True),
         "reduce_scatter")
    check(out, torch.full((3,), float(world * rank + world * (world - 1) // 2)), "async reduce_scatter")


# ---------------------------------------------------------------------------------------------
# all_to_all, all_to_all_single


def _split(src: int, dst: int) -> int:
    """Elements rank `src` sends to rank `dst` in the uneven cases (zeros included)."""
    return (3 * src + 2 * dst + 1) % 5


def case_all_to_all(dist: Any, rank: int, world: int, uneven: bool) -> None:
    """all_to_all(): output[j] on rank i is input[i] of rank j; blocks of equal sizes (0, 1 or
    4001 rows) or of unequal sizes (zeros included)."""
    for dtype in dtypes_for(list(ALL_DTYPES)):
        dt = ALL_DTYPES[dtype]
        for i, tail in enumerate([(), (3,), (4_001,)]):
            def rows(s: int, d: int) -> int:
                return _split(s, d) if uneven else (0, 1, 2)[i]

            def block(s: int, d: int) -> torch.Tensor:
                return cgen("any", dt, (rows(s, d), *tail), s, seed=100 * i + d)

            inp = [block(rank, d) for d in range(world)]
            out = [torch.zeros((rows(s, rank), *tail), dtype=dt) for s in range(world)]
            assert dist.all_to_all(out, inp) is None
            for s in range(world):
                check(out[s], block(s, rank), f"all_to_all {dtype} tail {tail}: block from rank {s} on rank {rank}")
    out = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    done(dist.all_to_all(out, [torch.full((2,), 10 * rank + d) for d in range(world)], async_op=True),
         "all_to_all")
    check(torch.stack(out), torch.stack([torch.full((2,), 10 * s + rank) for s in range(world)]), "async all_to_all")


def case_all_to_all_single(dist: Any, rank: int, world: int, uneven: bool) -> None:
    """all_to_all_single(): equal splits (split sizes None or []) or explicit unequal splits,
    1-D and 2-D tensors (split along dim 0)."""
    for dtype in dtypes_for(list(ALL_DTYPES)):
        dt = ALL_DTYPES[dtype]
        for i, tail in enumerate([(), (3,), (2_001,)]):
            if uneven:
                sizes = [[_split(s, d) for d in range(world)] for s in range(world)]
            else:
                sizes = [[(0, 1, 5)[i]] * world] * world

            def rows(s: int) -> torch.Tensor:
                return cgen("any", dt, (sum(sizes[s]), *tail), s, seed=i)

            inp = rows(rank)
            out = torch.full((sum(sizes[s][rank] for s in range(world)), *tail), 0, dtype=dt)
            expected = torch.cat([rows(s).split(sizes[s])[rank] for s in range(world)])
            if uneven:
                r = dist.all_to_all_single(out, inp, [sizes[s][rank] for s in range(world)], sizes[rank])
            else:
                r = dist.all_to_all_single(out, inp, [] if i == 1 else None, None)
            assert r is None
            check(inp, rows(rank), "all_to_all_single must not modify its input")
            check(out, expected, f"all_to_all_single {'uneven' if uneven else 'equal'} {dtype} tail {tail} rank {rank}")
    inp = torch.arange(world * 2, dtype=torch.float64) + 100 * rank
    out = torch.zeros(world * 2, dtype=torch.float64)
    done(dist.all_to_all_single(out, inp, async_op=True), "all_to_all_single")
    check(out, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float64) + 100 * s for s in range(world)]),
          "async all_to_all_single")


DOC_INPUT = [[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15, 16, 17, 18], [20, 21, 22, 23, 24],
             [30, 31, 32, 33, 34, 35, 36]]
DOC_INPUT_SPLITS = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]]
DOC_OUTPUT_SPLITS = [[2, 3, 2, 2], [2, 2, 1, 2], [1, 2, 1, 2], [1, 2, 1, 1]]
DOC_OUTPUT = [[0, 1, 10, 11, 12, 20, 21, 30, 31], [2, 3, 13, 14, 22, 32, 33], [4, 15, 16, 23, 34, 35],
              [5, 17, 18, 24, 36]]


def case_all_to_all_doc_example(dist: Any, rank: int, world: int, part: str) -> None:
    """The all_to_all_single ("single") and all_to_all ("list_equal", "list_uneven") examples
    of the docs (world size 4), literally: equal splits, the uneven splits, complex tensors."""
    assert world == 4
    cinp = torch.tensor([1 + 1j, 2 + 2j, 3 + 3j, 4 + 4j], dtype=torch.cfloat) + 4 * rank * (1 + 1j)
    if part == "list_equal":
        out_list = list(torch.empty([4], dtype=torch.int64).chunk(4))
        dist.all_to_all(out_list, list((torch.arange(4) + rank * 4).chunk(4)))
        check(torch.cat(out_list), torch.tensor([0, 4, 8, 12]) + rank, "docs all_to_all example")
        out_list = list(torch.empty([4], dtype=torch.cfloat).chunk(4))
        dist.all_to_all(out_list, list(cinp.chunk(4)))
        check(torch.cat(out_list), (torch.tensor([1, 5, 9, 13], dtype=torch.cfloat) + rank) * (1 + 1j),
              "docs all_to_all cfloat example")
        return
    if part == "list_uneven":
        out_list = [torch.empty(n, dtype=torch.int64) for n in DOC_OUTPUT_SPLITS[rank]]
        dist.all_to_all(out_list, list(torch.tensor(DOC_INPUT[rank]).split(DOC_INPUT_SPLITS[rank])))
        check(torch.cat(out_list), torch.tensor(DOC_OUTPUT[rank]), "docs all_to_all uneven example")
        return
    assert part == "single", part
    inp = torch.arange(4) + rank * 4
    out = torch.empty([4], dtype=torch.int64)
    dist.all_to_all_single(out, inp)
    check(out, torch.tensor([[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]])[rank],
          "docs all_to_all_single example")

    inp = torch.tensor(DOC_INPUT[rank])
    out = torch.empty(sum(DOC_OUTPUT_SPLITS[rank]), dtype=torch.int64)
    dist.all_to_all_single(out, inp, DOC_OUTPUT_SPLITS[rank], DOC_INPUT_SPLITS[rank])
    check(out, torch.tensor(DOC_OUTPUT[rank]), "docs all_to_all_single uneven-split example")

    cout = torch.empty([4], dtype=torch.cfloat)
    dist.all_to_all_single(cout, cinp)
    check(cout, (torch.tensor([1, 5, 9, 13], dtype=torch.cfloat) + rank) * (1 + 1j),
          "docs all_to_all_single cfloat example")


# ---------------------------------------------------------------------------------------------
# Coalesced collectives


def case_coalesced(dist: Any, rank: int, world: int) -> None:
    """all_reduce_coalesced(tensors) reduces each tensor; all_gather_coalesced fills
    output_tensor_lists[r][k] with input_tensor_list[k] of rank r."""
    shapes = [(0,), (1,), (7,), (2, 3), (20_001,)]
    for dtype in dtypes_for(["float32", "float64", "bfloat16", "int32", "int64", "uint8"]):
        dt = DTYPES[dtype]
        for op in ("SUM", "MAX"):
            xs = [[gen(data_kind(op), dt, s, r, seed=k) for k, s in enumerate(shapes)] for r in range(world)]
            mine = [x.clone() for x in xs[rank]]
            dist.all_reduce_coalesced(mine, op=rop(dist, op))
            for k, s in enumerate(shapes):
                check(mine[k], reduce_ref([xs[r][k] for r in range(world)], op),
                      f"all_reduce_coalesced {op} {dtype}: tensor {k} shape {s}")
        xs = [[gen("any", dt, s, r, seed=50 + k) for k, s in enumerate(shapes)] for r in range(world)]
        outs = [[torch.zeros(s, dtype=dt) for s in shapes] for _ in range(world)]
        dist.all_gather_coalesced(outs, [x.clone() for x in xs[rank]])
        for r in range(world):
            for k, s in enumerate(shapes):
                check(outs[r][k], xs[r][k], f"all_gather_coalesced {dtype}: tensor {k} shape {s} of rank {r}")
    mine = [torch.ones(3), torch.ones(2, 2)]
    done(dist.all_reduce_coalesced(mine, async_op=True), "all_reduce_coalesced")
    check(torch.cat([m.flatten() for m in mine]), torch.full((7,), float(world)), "async all_reduce_coalesced")


# ---------------------------------------------------------------------------------------------
# Complex tensors


def case_complex_api(dist: Any, rank: int, world: int, dtype: str) -> None:
    """Complex tensors through reduce (SUM), gather, scatter, all_gather, reduce_scatter (SUM),
    all_to_all_single, send/recv; MIN/MAX/PRODUCT/bitwise all_reduce raise ValueError naming
    the op (torch: "all_reduce does not support <op> on complex tensors")."""
    dt = COMPLEX[dtype]
    shape = (1001,)
    xs = [cgen("sum", dt, shape, r) for r in range(world)]
    for dst in range(world):
        t = xs[rank].clone()
        dist.reduce(t, dst=dst)
        if rank == dst:
            check(t, ref(xs, "SUM"), f"reduce SUM {dtype} dst {dst}")
    out = [torch.zeros(shape, dtype=dt) for _ in range(world)]
    dist.all_gather(out, xs[rank])
    check(torch.stack(out), torch.stack(xs), f"all_gather {dtype}")
    blocks = [[cgen("sum", dt, (5,), r, seed=10 + b) for b in range(world)] for r in range(world)]
    o = torch.zeros(5, dtype=dt)
    dist.reduce_scatter(o, blocks[rank])
    check(o, ref([blocks[r][rank] for r in range(world)], "SUM"), f"reduce_scatter SUM {dtype}")
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        got = torch.zeros(shape, dtype=dt)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[rank].clone(), right),
                                       dist.P2POp(dist.irecv, got, left)])
        for q in reqs:
            q.wait()
        check(got, xs[left], f"isend/irecv {dtype}")
    for op in COMPLEX_DENIED:
        expect_raises(ValueError, rf"{op}.*complex|complex.*{op}",
                      lambda: dist.all_reduce(torch.ones(4, dtype=dt), op=rop(dist, op)),
                      f"all_reduce({op}, {dtype})")
    sanity(dist, world)


# ---------------------------------------------------------------------------------------------
# every ReduceOp x dtype for all_reduce

MATRIX_SHAPES: list[tuple[int, ...]] = [(0,), (7,), (2, 3), (20_001,)]


def matrix_outcome(op: str, dtype: str) -> Optional[str]:
    """None when all_reduce(op) on `dtype` must work, else the regex of the exception types
    allowed: torch's ValueError for complex with ops other than SUM/AVG/PREMUL_SUM; bitwise ops
    on floats and AVG/PREMUL_SUM (scaling) on integers and bool must raise as well."""
    if dtype in COMPLEX:
        return "ValueError" if op in COMPLEX_DENIED else None
    if dtype in FLOATS:
        return "any" if op in BITWISE else None
    return "any" if op in ("AVG", "PREMUL_SUM") else None


def gloo_skips(op: str, dtype: str) -> Optional[str]:
    """Why gloo cannot run this combination (then the torch-mode run skips it)."""
    if op in ("AVG", "PREMUL_SUM"):
        return "gloo has no AVG or PREMUL_SUM"
    if dtype == "int16":
        return "gloo has no int16 collectives"
    if dtype in FLOATS and op in BITWISE:
        return "gloo fails bitwise ops on floats asynchronously and poisons the group"
    return None


def case_all_reduce_matrix(dist: Any, rank: int, world: int, op: str) -> dict[str, Any]:
    """all_reduce(op) on every dtype: supported ones give the reference result, unsupported ones
    raise with a message naming the op and the dtype, and the group stays usable. Collects every
    failure before raising, so one run reports the whole row; returns the combinations skipped
    under gloo."""
    failures: list[str] = []
    skipped: list[str] = []
    for dtype, dt in ALL_DTYPES.items():
        if IS_TORCH and gloo_skips(op, dtype):
            skipped.append(f"{op} {dtype}: {gloo_skips(op, dtype)}")
            continue
        outcome = matrix_outcome(op, dtype)
        if outcome is None:
            for i, shape in enumerate(MATRIX_SHAPES):
                xs = [cgen(kind_of(op), dt, shape, r, seed=i) for r in range(world)]
                t = xs[rank].clone()
                try:
                    assert dist.all_reduce(t, op=op_of(dist, op)) is None, "all_reduce returned a value"
                    check(t, ref(xs, op), f"all_reduce {op} {dtype} shape {shape}", tol_op(op))
                except Exception as e:  # noqa: BLE001 - collected and reported together
                    failures.append(f"{op} x {dtype} shape {shape}: expected the reference result, got "
                                    f"{type(e).__name__}: {e}")
                    break
            continue
        types = (ValueError,) if outcome == "ValueError" else (ValueError, TypeError, RuntimeError)
        try:
            dist.all_reduce(torch.ones(4, dtype=dt), op=op_of(dist, op))
        except types as e:
            msg = str(e)
            if not re.search(op.replace("_", "_?"), msg, re.IGNORECASE) or not re.search(
                    DTYPE_NAMES[dtype], msg, re.IGNORECASE):
                failures.append(f"{op} x {dtype}: {type(e).__name__} does not name the op and the dtype: {msg}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"{op} x {dtype}: expected {'/'.join(t.__name__ for t in types)}, got "
                            f"{type(e).__name__}: {e}")
        else:
            failures.append(f"{op} x {dtype}: expected {'/'.join(t.__name__ for t in types)}, nothing raised")
        try:
            sanity(dist, world)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{op} x {dtype}: group unusable after the error: {type(e).__name__}: {e}")
            break
    assert not failures, f"rank {rank}, world {world}:\n" + "\n".join(failures)
    return {"skipped": skipped}


def case_premul_sum_api(dist: Any, rank: int, world: int) -> None:
    """rustdist.make_premul_sum(f) and dist._make_nccl_premul_sum(f) scale each input by f
    before summing; they work in all_reduce, reduce, reduce_scatter_tensor and
    reduce_scatter; AVG works in reduce_scatter_tensor too."""
    xs = [gen("sum", torch.float64, (4 * world,), r) for r in range(world)]
    for name in ("make_premul_sum", "_make_nccl_premul_sum"):
        make = getattr(dist, name)
        for factor in (2.0, 0.5):
            expected = torch.stack(xs).sum(0) * factor
            t = xs[rank].clone()
            dist.all_reduce(t, op=make(factor))
            check(t, expected, f"all_reduce {name}({factor})")
            t = xs[rank].clone()
            dist.reduce(t, dst=world - 1, op=make(factor))
            if rank == world - 1:
                check(t, expected, f"reduce {name}({factor})")
            o = torch.zeros(4, dtype=torch.float64)
            dist.reduce_scatter_tensor(o, xs[rank].clone(), op=make(factor))
            check(o, expected[4 * rank:4 * rank + 4], f"reduce_scatter_tensor {name}({factor})")
            o = torch.zeros(4, dtype=torch.float64)
            dist.reduce_scatter(o, list(xs[rank].clone().chunk(world)), op=make(factor))
            check(o, expected[4 * rank:4 * rank + 4], f"reduce_scatter {name}({factor})")


def case_half_sums_round_once(dist: Any, rank: int, world: int) -> None:
    """SUM of bf16/f16 from every rank is accumulated in f32 and rounded once, as torch's
    own ``sum`` of a half tensor is: rank 0 holds a value whose half-precision spacing is 2,
    the others 0.75 each, which a pairwise fold would round away at every step. all_reduce
    (one-shot and two-shot sizes), reduce and reduce_scatter_tensor."""
    for dtype, big in ((torch.bfloat16, 256.0), (torch.float16, 2048.0)):
        for n in (8 * world, (1 << 20) // world * world):
            xs = [torch.full((n,), big if r == 0 else 0.75, dtype=dtype) for r in range(world)]
            expected = torch.stack(xs).float().sum(0).to(dtype)
            t = xs[rank].clone()
            dist.all_reduce(t)
            check(t, expected, f"all_reduce {dtype} x{n}")
            t = xs[rank].clone()
            dist.reduce(t, dst=world - 1)
            if rank == world - 1:
                check(t, expected, f"reduce {dtype} x{n}")
            o = torch.empty(n // world, dtype=dtype)
            dist.reduce_scatter_tensor(o, xs[rank].clone())
            check(o, expected[: n // world], f"reduce_scatter_tensor {dtype} x{n}")


# ---------------------------------------------------------------------------------------------
# Object collectives


def case_objects(dist: Any, rank: int, world: int, root: int) -> None:
    """broadcast_object_list, all_gather_object, gather_object, scatter_object_list and
    send/recv_object_list with `root` as src/dst; objects hold tensors, arrays and a 300 kB
    payload."""
    objs = [obj(root, seed=s) for s in range(3)]
    lst = list(objs) if rank == root else [None] * 3
    assert dist.broadcast_object_list(lst, src=root) is None
    assert same(lst, objs), f"broadcast_object_list from {root}: got {lst!r}"

    out: list[Any] = [None] * world
    assert dist.all_gather_object(out, obj(rank, seed=1)) is None
    for r in range(world):
        assert same(out[r], obj(r, seed=1)), f"all_gather_object: entry {r} is {out[r]!r}"

    gl: Optional[list[Any]] = [None] * world if rank == root else None
    assert dist.gather_object(obj(rank, seed=2), gl, dst=root) is None
    if rank == root:
        for r in range(world):
            assert same(gl[r], obj(r, seed=2)), f"gather_object to {root}: entry {r} is {gl[r]!r}"

    outl: list[Any] = [None]
    inl = [obj(r, seed=3) for r in range(world)] if rank == root else None
    assert dist.scatter_object_list(outl, inl, src=root) is None
    assert same(outl[0], obj(rank, seed=3)), f"scatter_object_list from {root}: got {outl[0]!r}"

    if world > 1:
        # recv_object_list returns the sender's rank. (torch 2.13 rejects src=None there:
        # "Must specify global_rank or group_rank", so any-source is not tested.)
        peer = (root + 1) % world
        if rank == root:
            assert dist.send_object_list([obj(root, 4), "x" * 10, 12], dst=peer) is None
        elif rank == peer:
            got: list[Any] = [None, None, None]
            sender = dist.recv_object_list(got, src=root)
            assert sender == root, f"recv_object_list(src={root}) returned {sender!r}"
            assert same(got, [obj(root, 4), "x" * 10, 12]), f"recv_object_list: got {got!r}"


def case_objects_doc_example(dist: Any, rank: int, world: int) -> None:
    """The object examples of the docs (world size 3; send/recv between ranks 0 and 1)."""
    assert world == 3
    objects = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objects, src=0, device=torch.device("cpu"))
    assert objects == ["foo", 12, {1: 2}], f"broadcast_object_list: {objects!r}"

    gather_objects = ["foo", 12, {1: 2}]
    output: list[Any] = [None for _ in gather_objects]
    dist.all_gather_object(output, gather_objects[rank])
    assert output == ["foo", 12, {1: 2}], f"all_gather_object: {output!r}"

    output = [None for _ in gather_objects]
    dist.gather_object(gather_objects[rank], output if rank == 0 else None, dst=0)
    if rank == 0:
        assert output == ["foo", 12, {1: 2}], f"gather_object: {output!r}"

    objects = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
    output_list: list[Any] = [None]
    dist.scatter_object_list(output_list, objects, src=0)
    assert output_list == [["foo", 12, {1: 2}][rank]], f"scatter_object_list: {output_list!r}"

    if rank == 0:
        dist.send_object_list(["foo", 12, {1: 2}], dst=1, device=torch.device("cpu"))
    elif rank == 1:
        objects = [None, None, None]
        dist.recv_object_list(objects, src=0, device=torch.device("cpu"))
        assert objects == ["foo", 12, {1: 2}], f"recv_object_list: {objects!r}"


# ---------------------------------------------------------------------------------------------
# Point to point: P2POp, batch_isend_irecv, self send, recv(src=None) with tags


def case_batch_doc_example(dist: Any, rank: int, world: int) -> None:
    """The batch_isend_irecv example of the docs (a ring; stated for world size 2)."""
    send_tensor = torch.arange(2, dtype=torch.float32) + 2 * rank
    recv_tensor = torch.randn(2, dtype=torch.float32)
    send_op = dist.P2POp(dist.isend, send_tensor, (rank + 1) % world)
    recv_op = dist.P2POp(dist.irecv, recv_tensor, (rank - 1 + world) % world)
    reqs = dist.batch_isend_irecv([send_op, recv_op])
    assert len(reqs) == 2, f"batch_isend_irecv returned {len(reqs)} requests for 2 ops"
    for req in reqs:
        req.wait()
    check(recv_tensor, torch.arange(2, dtype=torch.float32) + 2 * ((rank - 1) % world), "docs batch example")
    if world == 2:
        check(recv_tensor, torch.tensor([[2.0, 3.0], [0.0, 1.0]])[rank], "docs batch example (stated output)")


def case_batch_pairwise(dist: Any, rank: int, world: int) -> None:
    """One batch per rank with an irecv from and an isend to every peer, two tags each, in an
    order that differs per rank; dtypes vary per pair."""
    names = dtypes_for(list(ALL_DTYPES))
    got: dict[tuple[int, int], torch.Tensor] = {}
    ops = []
    for p in range(world):
        if p == rank:
            continue
        for tag in (0, 9):
            dt = ALL_DTYPES[names[(p + rank + tag) % len(names)]]
            got[(p, tag)] = torch.zeros(1001 + tag, dtype=dt)
            ops.append(dist.P2POp(dist.irecv, got[(p, tag)], p, tag=tag))
            ops.append(dist.P2POp(dist.isend, cgen("any", dt, (1001 + tag,), rank, seed=10 * p + tag), p, tag=tag))
    if rank % 2:
        ops.reverse()
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    for (p, tag), t in got.items():
        check(t, cgen("any", t.dtype, (1001 + tag,), p, seed=10 * rank + tag), f"batch from rank {p} tag {tag}")


def case_p2pop_invalid(dist: Any, rank: int, world: int) -> None:
    """P2POp accepts only isend/irecv (torch: ValueError "Invalid ``op``")."""
    expect_raises(ValueError, r"op", lambda: dist.P2POp(dist.all_reduce, torch.ones(2), 0), "P2POp(all_reduce)")
    expect_raises(ValueError, r"P2POp|p2p_op_list",
                  lambda: dist.batch_isend_irecv([torch.ones(2)]), "batch_isend_irecv([tensor])")
    sanity(dist, world)


def case_self_send(dist: Any, rank: int, world: int) -> None:
    """isend/irecv to the own rank (torch: "Unlike send ... isend allows src == dst rank"),
    on its own and inside batch_isend_irecv."""
    for dtype in ("float32", "int64", "complex128"):
        dt = ALL_DTYPES[dtype]
        x = cgen("any", dt, (5001,), rank)
        got = torch.zeros(5001, dtype=dt)
        rw = dist.irecv(got, src=rank)
        sw = dist.isend(x.clone(), dst=rank)
        sw.wait()
        rw.wait()
        check(got, x, f"isend/irecv to self {dtype}")
        got = torch.zeros(5001, dtype=dt)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x.clone(), rank, tag=3),
                                         dist.P2POp(dist.irecv, got, rank, tag=3)]):
            w.wait()
        check(got, x, f"batch isend/irecv to self {dtype}")
    sanity(dist, world)


def case_recv_any_tagged(dist: Any, rank: int, world: int) -> None:
    """recv(src=None, tag=t) returns the sender and matches by tag: every rank > 0 sends tag 4
    then tag 8; rank 0 receives all tag-8 messages first, then the tag-4 ones."""
    if rank == 0:
        for tag in (8, 4):
            seen = []
            for _ in range(world - 1):
                t = torch.zeros(3, dtype=torch.int64)
                src = dist.recv(t, tag=tag)
                assert src in range(1, world), f"recv(tag={tag}) returned {src!r}"
                check(t, torch.tensor([src, tag, src * tag]), f"recv(src=None, tag={tag}) from {src}")
                seen.append(src)
            assert sorted(seen) == list(range(1, world)), f"tag {tag}: senders {seen}"
    else:
        a = dist.isend(torch.tensor([rank, 4, rank * 4]), dst=0, tag=4)
        b = dist.isend(torch.tensor([rank, 8, rank * 8]), dst=0, tag=8)
        a.wait()
        b.wait()
    dist.barrier()


# ---------------------------------------------------------------------------------------------
# Groups


def _group_checks(dist: Any, rank: int, world: int, g: Any, members: list[int], what: str) -> None:
    """Collectives and rank queries on group `g` whose (sorted) members are `members`; a
    non-member checks that every call returns None and leaves its tensors alone."""
    n = len(members)
    if rank not in members:
        assert g == dist.GroupMember.NON_GROUP_MEMBER, f"{what}: new_group on a non-member returned {g!r}"
        assert dist.get_rank(g) == -1, f"{what}: get_rank(non-member group) = {dist.get_rank(g)}"
        assert dist.get_world_size(g) == -1, f"{what}: get_world_size(non-member group) = {dist.get_world_size(g)}"
        t = torch.full((4,), 7.0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dist.all_reduce(t, group=g) is None and torch.equal(t, torch.full((4,), 7.0)), \
                f"{what}: all_reduce on a group this rank is not in changed {t}"
        where = [w.filename for w in caught if "does not belong" in str(w.message)]
        assert where, f"{what}: no non-member warning"
        # rustdist's warning names the caller's line (here); torch's names one of its own.
        assert IS_TORCH or where == [__file__], f"{what}: non-member warning at {where}"
        # (Calls with a src/dst are left out: torch 2.13 maps the root to a group rank before
        # its membership check and raises ValueError there.)
        out = [torch.zeros(4) for _ in range(n)]
        assert dist.all_gather(out, t, group=g) is None and all(not o.any() for o in out), \
            f"{what}: all_gather on a group this rank is not in wrote its outputs"
        o = torch.zeros(2 * n)
        assert dist.all_to_all_single(o, torch.ones(2 * n), group=g) is None and not o.any(), \
            f"{what}: all_to_all_single on a group this rank is not in wrote its output"
        assert dist.barrier(group=g) is None
        return
    me = members.index(rank)
    assert dist.get_process_group_ranks(g) == members, f"{what}: ranks {dist.get_process_group_ranks(g)}"
    assert dist.get_rank(g) == me and dist.get_world_size(g) == n, \
        f"{what}: get_rank/get_world_size {dist.get_rank(g)}/{dist.get_world_size(g)}"
    assert g.rank() == me and g.size() == n, f"{what}: ProcessGroup.rank()/size() {g.rank()}/{g.size()}"
    for i, m in enumerate(members):
        assert dist.get_group_rank(g, m) == i and dist.get_global_rank(g, i) == m, f"{what}: rank map of {m}"
    outsider = next((r for r in range(world) if r not in members), None)
    if outsider is not None:
        # torch documents RuntimeError and raises ValueError.
        expect_raises((ValueError, RuntimeError), rf"{outsider}", lambda: dist.get_group_rank(g, outsider),
                      f"{what}: get_group_rank(non-member {outsider})")
    expect_raises((ValueError, RuntimeError), rf"{n}", lambda: dist.get_global_rank(g, n),
                  f"{what}: get_global_rank(group rank {n})")
    xs = [gen("sum", torch.float32, (1001,), m, seed=len(members)) for m in members]
    t = xs[me].clone()
    dist.all_reduce(t, group=g)
    check(t, reduce_ref(xs, "SUM"), f"{what}: all_reduce")
    t = xs[me].clone()
    dist.broadcast(t, src=members[-1], group=g)
    check(t, xs[-1], f"{what}: broadcast(src=global {members[-1]})")
    t = xs[me].clone()
    dist.broadcast(t, group=g, group_src=0)
    check(t, xs[0], f"{what}: broadcast(group_src=0)")
    t = xs[me].clone()
    dist.reduce(t, dst=members[-1], group=g, op=dist.ReduceOp.MAX)
    if rank == members[-1]:
        check(t, reduce_ref(xs, "MAX"), f"{what}: reduce(dst=global {members[-1]})")
    out = [torch.zeros(1001) for _ in members]
    dist.all_gather(out, xs[me], group=g)
    check(torch.stack(out), torch.stack(xs), f"{what}: all_gather")
    gl = [torch.zeros(1001) for _ in members] if me == 0 else None
    dist.gather(xs[me], gl, dst=members[0], group=g)
    if me == 0:
        check(torch.stack(gl), torch.stack(xs), f"{what}: gather(dst=global {members[0]})")
    o = torch.zeros(1001)
    dist.scatter(o, [x.clone() for x in xs] if me == n - 1 else None, src=members[-1], group=g)
    check(o, xs[me], f"{what}: scatter(src=global {members[-1]})")
    inp = torch.arange(2 * n, dtype=torch.int64) + 100 * rank
    o = torch.zeros(2 * n, dtype=torch.int64)
    dist.all_to_all_single(o, inp, group=g)
    check(o, torch.cat([torch.arange(2 * me, 2 * me + 2) + 100 * m for m in members]), f"{what}: all_to_all_single")
    lst: list[Any] = [None] * n
    dist.all_gather_object(lst, ("obj", rank), group=g)
    assert lst == [("obj", m) for m in members], f"{what}: all_gather_object {lst}"
    objs = [("b", members[-1])] if rank == members[-1] else [None]
    dist.broadcast_object_list(objs, src=members[-1], group=g)
    assert objs == [("b", members[-1])], f"{what}: broadcast_object_list {objs}"
    if n > 1:
        right, left = members[(me + 1) % n], members[(me - 1) % n]
        got = torch.zeros(3, dtype=torch.int64)
        rw = dist.irecv(got, src=left, group=g)
        dist.isend(torch.full((3,), rank), dst=right, group=g).wait()
        rw.wait()
        check(got, torch.full((3,), left), f"{what}: isend/irecv (global ranks) in the group")
        got = torch.zeros(3, dtype=torch.int64)
        rw = dist.irecv(got, group=g, group_src=(me - 1) % n)
        dist.isend(torch.full((3,), 2 * rank), group=g, group_dst=(me + 1) % n).wait()
        rw.wait()
        check(got, torch.full((3,), 2 * left), f"{what}: isend/irecv (group_dst/group_src)")
    dist.barrier(group=g)


def case_new_group(dist: Any, rank: int, world: int) -> None:
    """new_group: the whole world (ranks None), each single rank, every rank but the last,
    the even ranks, ranks given unsorted, and overlapping groups; members run collectives and
    p2p with global ranks, non-members get NON_GROUP_MEMBER and no-ops. Then the groups are
    destroyed and the world group still works."""
    specs: list[list[int]] = [list(range(world))]
    specs += [[r] for r in range(world)]
    if world > 2:
        specs.append(list(range(world - 1)))
    if world > 1:
        specs.append([r for r in range(world) if r % 2 == 0])
        specs.append(list(reversed(range(world))))
    if world > 2:
        specs += [[0, 1], [1, 2]] if world == 3 else [[0, 1, 2], [3, 2, 1]]
    groups = [dist.new_group() if spec == specs[0] else dist.new_group(spec) for spec in specs]
    for spec, g in zip(specs, groups):
        _group_checks(dist, rank, world, g, sorted(spec), f"new_group({spec}) at world {world}")
    # Overlapping groups used interleaved.
    for spec, g in reversed(list(zip(specs, groups))):
        if rank in spec:
            t = torch.full((2,), rank + 1, dtype=torch.int64)
            dist.all_reduce(t, group=g)
            check(t, torch.full((2,), sum(r + 1 for r in spec), dtype=torch.int64), f"interleaved all_reduce on {spec}")
    for spec, g in zip(specs, groups):
        if rank in spec:
            dist.destroy_process_group(g)
    sanity(dist, world)


def case_destroy_subgroup(dist: Any, rank: int, world: int, use_destroyed: bool) -> None:
    """destroy_process_group(subgroup) removes only that group: the world group and other
    subgroups keep working, and a new group can be made. With `use_destroyed`, an all_reduce
    on the destroyed group must raise ValueError/RuntimeError (rustdist-only: torch leaves a
    destroyed gloo group usable, its all_reduce still reduces)."""
    a = dist.new_group(list(range(world)))
    b = dist.new_group(list(range(world)))
    dist.destroy_process_group(a)
    if use_destroyed:
        expect_raises((ValueError, RuntimeError), r"group|destroy|invalid",
                      lambda: dist.all_reduce(torch.ones(3), group=a), "all_reduce on a destroyed group")
    t = torch.ones(3)
    dist.all_reduce(t, group=b)
    check(t, torch.full((3,), float(world)), "all_reduce on the surviving subgroup")
    dist.destroy_process_group(b)
    c = dist.new_group(list(range(world)))
    t = torch.ones(3)
    dist.all_reduce(t, group=c)
    check(t, torch.full((3,), float(world)), "all_reduce on a group made after destroying others")
    dist.destroy_process_group(c)
    assert dist.is_initialized(), "destroy_process_group(subgroup) deinitialised the default group"
    sanity(dist, world)


def _check_subgroups(dist: Any, rank: int, cur: Any, subs: list[Any], blocks: list[list[int]],
                     what: str) -> None:
    """(cur, subs) as returned for subgroups `blocks`: one entry per block (NON_GROUP_MEMBER
    where this rank is not a member), cur the rank's own subgroup (None if in none); an
    all_reduce in cur sums over its members only. Destroys cur."""
    assert len(subs) == len(blocks), f"{what}: {len(subs)} subgroups returned for {blocks}"
    for s, block in zip(subs, blocks):
        if rank in block:
            assert dist.get_process_group_ranks(s) == block, f"{what}: subgroup {block} has ranks " \
                f"{dist.get_process_group_ranks(s)}"
        else:
            assert s == dist.GroupMember.NON_GROUP_MEMBER, f"{what}: entry for {block} on non-member {rank}: {s!r}"
    mine = next((b for b in blocks if rank in b), None)
    if mine is None:
        assert cur is None, f"{what}: rank {rank} is in no subgroup but got {cur!r}"
        return
    assert dist.get_process_group_ranks(cur) == mine, f"{what}: current subgroup {dist.get_process_group_ranks(cur)}"
    t = torch.full((3,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t, group=cur)
    check(t, torch.full((3,), sum(r + 1 for r in mine), dtype=torch.int64), f"{what}: all_reduce in the subgroup")
    dist.destroy_process_group(cur)


def case_new_subgroups(dist: Any, rank: int, world: int, group_size: int) -> None:
    """new_subgroups(group_size): consecutive blocks of group_size ranks; returns (the rank's
    subgroup, all subgroups)."""
    cur, subs = dist.new_subgroups(group_size=group_size)
    blocks = [list(range(s, s + group_size)) for s in range(0, world, group_size)]
    _check_subgroups(dist, rank, cur, subs, blocks, f"new_subgroups(group_size={group_size})")
    if world % 2 and world > 1:
        expect_raises(ValueError, r"divisible|group_size|world", lambda: dist.new_subgroups(group_size=2),
                      f"new_subgroups(group_size=2) at world {world}")
    sanity(dist, world)


def case_new_subgroups_by_enumeration(dist: Any, rank: int, world: int) -> None:
    """new_subgroups_by_enumeration(ranks_per_subgroup_list): the given (disjoint) groups;
    a rank in none of them gets None as its current subgroup."""
    spec = {2: [[1], [0]], 3: [[2, 0]], 4: [[0, 2], [3, 1]]}[world]
    cur, subs = dist.new_subgroups_by_enumeration(spec)
    _check_subgroups(dist, rank, cur, subs, [sorted(s) for s in spec], f"new_subgroups_by_enumeration({spec})")
    expect_raises(ValueError, r"rank|overlap|more than one|duplicate",
                  lambda: dist.new_subgroups_by_enumeration([[0, 1], [1]] if world > 1 else [[0], [0]]),
                  "overlapping ranks_per_subgroup_list")
    sanity(dist, world)


def case_concurrent_groups(dist: Any, rank: int, world: int) -> None:
    """Async all_reduces on two groups in flight at once, issued in a rank-dependent order and
    waited in reverse: no deadlock and no mixing of the two groups' data. Two groups over all
    ranks, and (world 4) the overlapping groups [0, 1, 2] and [1, 2, 3]."""
    pairs = [(list(range(world)), list(range(world)))]
    if world == 4:
        pairs.append(([0, 1, 2], [1, 2, 3]))
    for spec_a, spec_b in pairs:
        ga, gb = dist.new_group(spec_a), dist.new_group(spec_b)
        for rnd in range(3):
            xa = [gen("sum", torch.float32, (200_003,), r, seed=rnd) for r in range(world)]
            xb = [gen("sum", torch.float64, (150_001,), r, seed=rnd + 10) for r in range(world)]
            ta, tb = xa[rank].clone(), xb[rank].clone()
            issue = [("a", ga, ta, spec_a), ("b", gb, tb, spec_b)]
            if (rank + rnd) % 2:
                issue.reverse()
            works = [dist.all_reduce(t, group=g, async_op=True) for _, g, t, spec in issue if rank in spec]
            for w in reversed(works):
                w.wait()
            if rank in spec_a:
                check(ta, reduce_ref([xa[r] for r in spec_a], "SUM"), f"group {spec_a} round {rnd}")
            if rank in spec_b:
                check(tb, reduce_ref([xb[r] for r in spec_b], "SUM"), f"group {spec_b} round {rnd}")
        for g, spec in ((ga, spec_a), (gb, spec_b)):
            if rank in spec:
                dist.destroy_process_group(g)
    sanity(dist, world)


# ---------------------------------------------------------------------------------------------
# monitored_barrier


def case_monitored_barrier_ok(dist: Any, rank: int, world: int) -> None:
    """Every rank joins: monitored_barrier returns None (with and without wait_all_ranks)."""
    assert dist.monitored_barrier(timeout=timedelta(seconds=20)) is None
    assert dist.monitored_barrier(timeout=timedelta(seconds=20), wait_all_ranks=True) is None
    sanity(dist, world)


def case_monitored_barrier_missing(dist: Any, rank: int, world: int, missing: list[int],
                                   wait_all_ranks: bool) -> dict[str, Any]:
    """Ranks in `missing` skip the call. Rank 0 raises naming the missing rank (the first one,
    or all with wait_all_ranks=True); the other callers fail too (they never get rank 0's
    acknowledgement)."""
    if rank in missing:
        return {"called": False}
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=wait_all_ranks)
    except RuntimeError as e:
        msg = str(e)
    else:
        raise AssertionError(f"rank {rank}: monitored_barrier returned although ranks {missing} never called it")
    if rank == 0:
        named = missing if wait_all_ranks else missing[:1]
        for m in named:
            assert re.search(rf"(?<![\d:.]){m}(?![\d:.])", msg), f"rank 0: message does not name rank {m}: {msg}"
        if not wait_all_ranks:
            assert not re.search(rf"(?<![\d:.]){missing[1]}(?![\d:.])", msg), \
                f"rank 0 (wait_all_ranks=False): message names rank {missing[1]} beyond the first: {msg}"
    return {"called": True, "msg": msg}


# ---------------------------------------------------------------------------------------------
# DETAIL debug mode


def case_detail_init(dist: Any, rank: int, world: int) -> None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL, then init_process_group (torch reads the variable when
    torch.distributed is imported, so torch mode re-reads it)."""
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if IS_TORCH:
        dist.set_debug_level_from_env()
    init_env(dist, rank, world, ctx.pg_timeout)
    sanity(dist, world)


def case_detail_mismatch(dist: Any, rank: int, world: int, kind: str) -> None:
    """Rank 0 differs from the others in one respect; every rank raises RuntimeError at the
    call, naming rank 0 (rank 0 names another rank) and what differs; the group then works."""
    odd = rank == 0
    if kind == "shape":
        call: Callable[[], Any] = lambda: dist.all_reduce(torch.ones(8 if odd else 16))  # noqa: E731
        pat = r"shape|size|numel|\b8\b.*\b16\b|\b16\b.*\b8\b"
    elif kind == "shape_same_numel":
        call = lambda: dist.all_reduce(torch.ones((2, 4) if odd else (4, 2)))  # noqa: E731
        pat = r"shape|size"
    elif kind == "dtype":
        call = lambda: dist.all_reduce(torch.ones(8, dtype=torch.float32 if odd else torch.int32))  # noqa: E731
        pat = r"dtype|float.*int|int.*float"
    elif kind == "op":
        call = lambda: dist.all_reduce(torch.ones(8), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)  # noqa: E731
        pat = r"MAX.*SUM|SUM.*MAX|reduce op|\bop\b"
    elif kind == "collective":
        call = (lambda: dist.all_reduce(torch.ones(8))) if odd else (lambda: dist.broadcast(torch.ones(8), src=0))
        pat = r"(all_?reduce).*(broadcast)|(broadcast).*(all_?reduce)"
    else:
        raise ValueError(kind)
    e = expect_raises(RuntimeError, pat, call, f"DETAIL {kind} mismatch on rank {rank}")
    msg = str(e)
    assert re.search(r"rank\s*0\b", msg, re.IGNORECASE), f"rank {rank}: message does not name rank 0: {msg}"
    if rank == 0:
        assert re.search(r"rank\s*[1-9]", msg, re.IGNORECASE), f"rank 0: message names no other rank: {msg}"
    sanity(dist, world)
    t = torch.ones(5, dtype=torch.float64)
    dist.broadcast(t, src=world - 1)
    dist.barrier()
