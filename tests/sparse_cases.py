"""Cases for tests/test_sparse.py: sparse COO tensors in ``all_reduce`` (ReduceOp.SUM, as
gloo runs it), the errors of every other op on them, and DDP with sparse gradients against gloo.

The driver names them ``"sparse_cases:<name>"`` (see harness.find_case). Inputs are
deterministic by rank, so every rank rebuilds every rank's tensor and checks the result
element by element against a reference computed locally: the dense sum of the ranks' tensors
(values are small integers, so sums are exact in every dtype), and the coalesced union of the
ranks' indices. The expectations are gloo's (``RUSTDIST_TEST_DIST=torch`` validates them):
the input tensor object is updated in place and left coalesced, and the Work's result and
future hold that object.

The DDP cases train two copies of one model on the same data: one under DDP over a gloo group
(``torch.distributed.new_group(backend="gloo")``, the reference), one over the group under
test (rustdist's own group handed to DDP in rustdist mode, the default group of
``torch.distributed`` in torch mode), and compare the final parameters exactly.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any, Callable, Optional

import torch
from torch import nn

from dist_cases import expect_raises, sanity
from harness import HOSTS_SPEC, ctx

IS_TORCH = ctx.mode == "torch"
#: The text of the error gloo raises for any op but SUM (after a backend-specific prefix).
UNSUPPORTED_OP = (r"unsupported reduction operation \(allreduce of sparse tensors only works "
                  r"with ReduceOp\.SUM\)")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "float16": torch.float16, "bool": torch.bool,
    "complex64": torch.complex64,
}
#: dtypes torch's sparse addition has no CPU kernel for ("cadd_sparse" not implemented): gloo's
#: sum of several ranks' tensors raises NotImplementedError; one rank adds nothing.
NO_SPARSE_ADD = {"float16", "bool"}


def sparse_input(kind: str, rank: int, world: int, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s sparse COO tensor for input ``kind``, rebuildable by any rank.

    "coalesced": 2-D (9, 7), 2 + 3 * rank distinct non-zeros, coalesced.
    "uncoalesced": the same shape with repeated indices, not coalesced.
    "some_empty": nnz 0 on odd ranks, 4 non-zeros on even ones.
    "all_empty": nnz 0 everywhere.
    "hybrid": 1 sparse and 2 dense dimensions (11, 3, 2), uncoalesced, rows overlapping.
    "cancel": values that cancel across ranks (the sum keeps explicit zeros, as gloo's does).
    "three_d": 3 sparse dimensions (4, 5, 6).
    "single": one non-zero at one shared index on every rank.
    """
    g = torch.Generator().manual_seed(7919 * rank + 104_729 * seed + 13)

    def values(n: int, *dense: int) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.ones((n, *dense), dtype=torch.bool)
        low = 0 if dtype == torch.uint8 else -4
        v = torch.randint(low, 5, (n, *dense), generator=g)
        if dtype.is_complex:
            imag = torch.randint(-4, 5, (n, *dense), generator=g)
            return torch.complex(v.float(), imag.float()).to(dtype)
        return v.to(dtype)

    def pick(n: int, numel: int) -> torch.Tensor:
        return torch.randperm(numel, generator=g)[:n]

    if kind == "coalesced" or kind == "some_empty" or kind == "all_empty":
        n = {"coalesced": 2 + 3 * rank, "some_empty": 0 if rank % 2 else 4, "all_empty": 0}[kind]
        flat = pick(n, 63).sort().values
        idx = torch.stack([flat // 7, flat % 7])
        t = torch.sparse_coo_tensor(idx, values(n), (9, 7), check_invariants=True)
        return t.coalesce() if kind == "coalesced" else t
    if kind == "uncoalesced":
        n = 6 + rank
        idx = torch.stack([torch.randint(0, 3, (n,), generator=g),
                           torch.randint(0, 7, (n,), generator=g)])
        return torch.sparse_coo_tensor(idx, values(n), (9, 7), check_invariants=True)
    if kind == "hybrid":
        n = 3 + rank
        idx = torch.randint(0, 6, (1, n), generator=g)
        return torch.sparse_coo_tensor(idx, values(n, 3, 2), (11, 3, 2), check_invariants=True)
    if kind == "cancel":
        idx = torch.tensor([[0, 2, 4], [1, 1, 1]])
        sign = 1 if rank % 2 == 0 else -1
        v = torch.tensor([3, 2, 1]) * sign
        if rank == world - 1 and world % 2:  # an odd world: the last rank cancels nothing
            v = torch.zeros(3, dtype=torch.int64)
        return torch.sparse_coo_tensor(idx, v.to(dtype), (5, 2), check_invariants=True).coalesce()
    if kind == "three_d":
        n = 4 + 2 * rank
        flat = pick(n, 120)
        idx = torch.stack([flat // 30, flat // 6 % 5, flat % 6])
        return torch.sparse_coo_tensor(idx, values(n), (4, 5, 6), check_invariants=True)
    if kind == "single":
        return torch.sparse_coo_tensor(torch.tensor([[2]]), values(1), (4,), check_invariants=True)
    raise ValueError(f"unknown input kind {kind!r}")


def reference(kind: str, world: int, dtype: torch.dtype) -> torch.Tensor:
    """The coalesced sum every rank must end with: the union of the ranks' indices (sorted,
    explicit zeros kept) with values summed in a wider dtype, exact for this data."""
    xs = [sparse_input(kind, r, world, dtype).coalesce() for r in range(world)]
    wide = torch.complex128 if dtype.is_complex else (
        torch.int64 if dtype == torch.bool else torch.float64)
    indices = torch.cat([x._indices() for x in xs], 1)
    values = torch.cat([x._values().to(wide) for x in xs])
    out = torch.sparse_coo_tensor(indices, values, xs[0].shape, check_invariants=True).coalesce()
    return torch.sparse_coo_tensor(out._indices(), out._values().to(dtype), out.shape,
                                   check_invariants=True).coalesce()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether sparse ``a`` and ``b`` have equal indices and values (and coalesced flags)."""
    return (a.is_coalesced() == b.is_coalesced() and torch.equal(a._indices(), b._indices())
            and torch.equal(a._values(), b._values()))


def check_sum(got: torch.Tensor, want: torch.Tensor, dense_sum: torch.Tensor, what: str) -> None:
    """``got`` is sparse, coalesced, and equals ``want`` (indices and values) element by
    element, and its dense form equals the dense sum of the inputs."""
    assert got.layout == torch.sparse_coo, f"{what}: layout {got.layout}"
    assert got.is_coalesced(), f"{what}: the result is not coalesced"
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
    assert torch.equal(got._indices(), want._indices()), (
        f"{what}: indices\n{got._indices()}\nwant\n{want._indices()}")
    torch.testing.assert_close(got._values(), want._values(), rtol=0, atol=0,
                               msg=lambda m: f"{what}: values: {m}")
    torch.testing.assert_close(got.to_dense(), dense_sum, rtol=0, atol=0,
                               msg=lambda m: f"{what}: dense form: {m}")


def dense_sum(kind: str, world: int, dtype: torch.dtype) -> torch.Tensor:
    """The sum of the ranks' tensors of input ``kind`` as a dense tensor (exact)."""
    wide = torch.complex128 if dtype.is_complex else (
        torch.int64 if dtype == torch.bool else torch.float64)
    total = sum(sparse_input(kind, r, world, dtype).to_dense().to(wide) for r in range(world))
    return total.to(dtype)


# ---------------------------------------------------------------------------------------------
# all_reduce


def case_all_reduce(dist: Any, rank: int, world: int, kind: str, dtype: str = "float32",
                    mode: str = "sync") -> None:
    """all_reduce(SUM) of sparse input ``kind``: ``mode`` "sync", "async" (the Work's
    wait(), result() and get_future() give the same tensor object) or "explicit_op" (op
    passed as ReduceOp.SUM)."""
    dt = DTYPES[dtype]
    t = sparse_input(kind, rank, world, dt)
    if mode == "async":
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        assert work.wait() is True
        value = fut.wait()
        assert isinstance(value, list) and len(value) == 1 and value[0] is t, (
            f"the future's value is not [input tensor]: {value!r}")
        result = work.result()
        assert len(result) == 1 and result[0] is t, f"result() is not [input tensor]: {result!r}"
        assert work.is_completed() and work.is_success()
    elif mode == "explicit_op":
        assert dist.all_reduce(t, op=dist.ReduceOp.SUM) is None
    else:
        assert dist.all_reduce(t) is None
    check_sum(t, reference(kind, world, dt), dense_sum(kind, world, dt), f"{kind} {dtype}")


def case_all_reduce_in_place(dist: Any, rank: int, world: int) -> None:
    """The input object is updated (not replaced), and its old indices and values tensors are
    left as they were (gloo copies the sum in)."""
    t = sparse_input("uncoalesced", rank, world)
    old_indices, old_values = t._indices().clone(), t._values().clone()
    kept_indices, kept_values = t._indices(), t._values()
    ident = id(t)
    dist.all_reduce(t)
    assert id(t) == ident
    assert torch.equal(kept_indices, old_indices) and torch.equal(kept_values, old_values), (
        "the input's former indices/values tensors were written to")
    check_sum(t, reference("uncoalesced", world, torch.float32),
              dense_sum("uncoalesced", world, torch.float32), "uncoalesced")
    sanity(dist, world)


def case_dtype_unsupported_by_sparse_add(dist: Any, rank: int, world: int, dtype: str) -> None:
    """float16 and bool: torch has no sparse addition for them on CPU, so gloo's sum of
    several ranks raises NotImplementedError (after the exchange, on every rank) and leaves
    the tensor as it was; one rank has nothing to add and coalesces."""
    dt = DTYPES[dtype]
    t = sparse_input("coalesced", rank, world, dt)
    before = t.clone()
    if world == 1:
        dist.all_reduce(t)
        check_sum(t, reference("coalesced", 1, dt), dense_sum("coalesced", 1, dt), dtype)
        return
    expect_raises(NotImplementedError, r'"cadd_sparse" not implemented for',
                  lambda: dist.all_reduce(t), f"sparse all_reduce of {dtype}")
    assert same(t, before), f"the failed all_reduce changed the {dtype} tensor"
    sanity(dist, world)


def case_complex(dist: Any, rank: int, world: int) -> None:
    """A complex sparse tensor. rustdist's own all_reduce sums it in place; torch.distributed's
    all_reduce hands the backend ``torch.view_as_real(tensor)``, which for a sparse tensor is a
    copy, so with gloo (and on rustdist's torch door alike) the sum lands in that copy and the
    caller's tensor is left as it was."""
    dt = torch.complex64
    t = sparse_input("coalesced", rank, world, dt)
    before = t.clone()
    dist.all_reduce(t)
    if IS_TORCH:
        assert same(t, before), "torch.distributed.all_reduce changed a complex sparse tensor"
    else:
        check_sum(t, reference("coalesced", world, dt), dense_sum("coalesced", world, dt),
                  "complex64")


def case_repeated(dist: Any, rank: int, world: int) -> None:
    """Many sparse all_reduces in a row, interleaved with dense ones and async ones waited
    for out of order: each gives its own result."""
    kinds = ["coalesced", "uncoalesced", "some_empty", "hybrid", "three_d", "single"]
    works = []
    for i, kind in enumerate(kinds):
        t = sparse_input(kind, rank, world)
        d = torch.full((5,), float(rank + i))
        works.append((kind, t, dist.all_reduce(t, async_op=True), d,
                      dist.all_reduce(d, async_op=True), i))
    for kind, t, w, d, dw, i in reversed(works):
        dw.wait()
        w.wait()
        check_sum(t, reference(kind, world, torch.float32),
                  dense_sum(kind, world, torch.float32), kind)
        assert torch.equal(d, torch.full((5,), float(sum(range(world)) + world * i)))


# ---------------------------------------------------------------------------------------------
# errors


def case_other_op(dist: Any, rank: int, world: int, op: str) -> None:
    """Any op but SUM raises RuntimeError with gloo's text, before communicating, on every
    rank; the tensor is untouched and the group still works."""
    t = sparse_input("uncoalesced", rank, world)
    before = t.clone()
    reduce_op = (dist._make_nccl_premul_sum(2.0) if op == "PREMUL_SUM"
                 else getattr(dist.ReduceOp, op))
    expect_raises(RuntimeError, UNSUPPORTED_OP, lambda: dist.all_reduce(t, op=reduce_op),
                  f"sparse all_reduce with {op}")
    expect_raises(RuntimeError, UNSUPPORTED_OP,
                  lambda: dist.all_reduce(t, op=reduce_op, async_op=True),
                  f"async sparse all_reduce with {op}")
    assert not t.is_coalesced() and torch.equal(t._values(), before._values())
    sanity(dist, world)


def case_shape_mismatch(dist: Any, rank: int, world: int, how: str) -> None:
    """Ranks whose sparse tensors differ in shape ("size") or in their sparse/dense split
    ("split"): every rank raises RuntimeError("Sparse dimensions do not match") as gloo does
    (gloo checks the sizes; a differing split with equal sizes aborts its process, rustdist
    raises the same error)."""
    if how == "size":
        t = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (3, 4 + rank % 2))
    else:
        t = (torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (3, 4))
             if rank % 2 == 0 else
             torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 4), (3, 4)))
    expect_raises(RuntimeError, r"^Sparse dimensions do not match$", lambda: dist.all_reduce(t),
                  f"sparse all_reduce of mismatched tensors ({how})")
    sanity(dist, world)


def case_leaf_requires_grad(dist: Any, rank: int, world: int) -> None:
    """A leaf that requires grad: torch's in-place check raises before anything is sent."""
    t = sparse_input("coalesced", rank, world).requires_grad_()
    expect_raises(RuntimeError, r"a leaf Variable that requires grad is being used in an "
                  r"in-place operation", lambda: dist.all_reduce(t), "all_reduce of a leaf")
    sanity(dist, world)


def _other_ops(dist: Any, rank: int, world: int, s: torch.Tensor
               ) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Every collective but all_reduce given sparse ``s``: name -> (pattern naming the op in
    gloo's error and in rustdist's, call)."""
    peer = (rank + 1) % world
    dense = torch.zeros(12, 7)

    def outs() -> list[torch.Tensor]:
        return [dense.clone() for _ in range(world)]

    return {
        "broadcast": (r"broadcast", lambda: dist.broadcast(s, 0)),
        "reduce": (r"reduce", lambda: dist.reduce(s, 0)),
        "all_gather": (r"all_?gather", lambda: dist.all_gather(outs(), s)),
        "all_gather_into_tensor": (r"all_?gather(_into_tensor|_base)",
                                   lambda: dist.all_gather_into_tensor(dense.repeat(world, 1), s)),
        "reduce_scatter_tensor": (r"reduce_scatter(_tensor|_base)",
                                  lambda: dist.reduce_scatter_tensor(dense[:12 // world], s)),
        # gloo's reduce_scatter copies its inputs into a dense buffer first (RuntimeError:
        # "copy_() between dense and sparse Tensors is not implemented!"), and so does
        # rustdist's torch door (torch's reshape: "reshape is not implemented for sparse
        # tensors"): neither names the op, so only rustdist's own function is held to that.
        "reduce_scatter": (r"sparse" if IS_TORCH else r"reduce_scatter",
                           lambda: dist.reduce_scatter(dense.clone(), [s] * world)),
        "gather": (r"gather", lambda: dist.gather(s, outs() if rank == 0 else None, dst=0)),
        "scatter": (r"scatter", lambda: dist.scatter(s, outs() if rank == 0 else None, src=0)),
        "all_to_all": (r"all_?to_?all", lambda: dist.all_to_all(outs(), [s] * world)),
        "all_to_all_single": (r"all_?to_?all(_single|_base)",
                              lambda: dist.all_to_all_single(torch.zeros(12, 7), s)),
        "all_reduce_coalesced": (r"all_?reduce_coalesced", lambda: dist.all_reduce_coalesced([s])),
        "all_reduce_coalesced_2": (r"all_?reduce_coalesced",
                                   lambda: dist.all_reduce_coalesced([s, s.clone()])),
        "send": (r"send", lambda: dist.send(s, peer)),
        "isend": (r"send", lambda: dist.isend(s, peer)),
        "recv": (r"recv", lambda: dist.recv(s, peer)),
        "irecv": (r"recv", lambda: dist.irecv(s, peer)),
    }


OTHER_OPS = ["broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "reduce_scatter", "gather", "scatter", "all_to_all", "all_to_all_single",
             "all_reduce_coalesced", "all_reduce_coalesced_2", "send", "isend", "recv", "irecv"]


def case_other_collective(dist: Any, rank: int, world: int, op: str) -> None:
    """Every other collective refuses a sparse tensor at the call, on every rank, with
    NotImplementedError naming the operation (gloo: torch's dispatcher, "Could not run
    'c10d::broadcast_' with arguments from the 'SparseCPU' backend"; reduce_scatter through
    torch.distributed: a RuntimeError from torch, see _other_ops); the group still works."""
    s = torch.sparse_coo_tensor(torch.tensor([[0, 5, 11], [1, 2, 6]]), torch.ones(3), (12, 7),
                                check_invariants=True)
    pattern, call = _other_ops(dist, rank, world, s)[op]
    types = RuntimeError if IS_TORCH and op == "reduce_scatter" else NotImplementedError
    e = expect_raises(types, pattern, call, f"{op} of a sparse tensor")
    assert re.search(r"sparse", str(e), re.IGNORECASE), f"{op}: the error does not say sparse: {e}"
    sanity(dist, world)


# ---------------------------------------------------------------------------------------------
# DDP with sparse gradients


VOCAB, DIM, OUT = 40, 6, 3
STEPS = 6


class SparseNet(nn.Module):
    """An embedding bag with sparse gradients feeding a linear layer: trainable ("mixed":
    DDP reduces a sparse and a dense bucket) or a fixed buffer ("sparse_only")."""

    def __init__(self, dense: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, sparse=True)
        fc = nn.Linear(DIM, OUT)
        if dense:
            self.fc = fc
        else:
            self.register_buffer("proj", fc.weight.detach().t().contiguous())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx).sum(1)
        return self.fc(h) if hasattr(self, "fc") else h @ self.proj


def ddp_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: ids with repeats (uncoalesced gradients), a rank
    with an empty batch every third step (a zero-nnz gradient)."""
    g = torch.Generator().manual_seed(31 * step + rank)
    rows = 0 if (rank == 1 and step % 3 == 2) else 2 + rank
    ids = torch.randint(0, VOCAB // 2 + 5 * rank, (rows, 4), generator=g)
    return ids, torch.randn(rows, OUT, generator=g)


def _custom_hook(state: tuple[Any, Any], bucket: Any) -> torch.futures.Future:
    """A comm hook that all-reduces the bucket with ``state`` = (API module, group) and
    averages the result it reads from the future (DDP's own allreduce_hook divides first)."""
    api, group = state
    size = group.size()
    fut = api.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(size))


# DDP checks a hook's annotations against the real classes; this module's are strings.
_custom_hook.__annotations__.update(
    {"bucket": torch.distributed.GradBucket, "return": torch.futures.Future[torch.Tensor]})


def _train(group: Any, api: Any, rank: int, model: str, hook: Optional[str],
           bucket_view: bool) -> dict[str, torch.Tensor]:
    """Trains a SparseNet (same init on every call) under DDP over ``group``; returns its
    final parameters and buffers."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1234)
    ddp = DDP(SparseNet(dense=model == "mixed"), process_group=group,
              gradient_as_bucket_view=bucket_view)
    if hook == "allreduce":
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    elif hook == "custom":
        ddp.register_comm_hook((api, group), _custom_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        ids, y = ddp_batch(rank, step)
        (((ddp(ids) - y) ** 2).sum() / 16).backward()
        assert ddp.module.emb.weight.grad.layout == torch.sparse_coo
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}


def _gloo_group() -> Any:
    """A gloo group over every rank, made once per default group (new_group is collective;
    a case elsewhere that re-initialises the world destroys it on every rank alike)."""
    import torch.distributed as td

    world_group = td.group.WORLD
    made = ctx.state.get("sparse_gloo")
    if made is None or made[0] is not world_group:
        if HOSTS_SPEC:  # a test host's hostname resolves nowhere: name gloo its interface
            nics = sorted(name for _, name in socket.if_nameindex() if name != "lo")
            os.environ.setdefault("GLOO_SOCKET_IFNAME", nics[0])
        made = ctx.state["sparse_gloo"] = (world_group, td.new_group(backend="gloo"))
    return made[1]


def case_ddp(dist: Any, rank: int, world: int, model: str, hook: Optional[str],
             bucket_view: bool) -> None:
    """DDP with sparse embedding gradients trains to gloo's parameters: over rustdist's own
    group given to DDP (import-swap door, rustdist mode) or over torch.distributed's default
    group (torch door with the "rustdist" backend; gloo against gloo in gloo mode).

    Compared exactly, but for the "mixed" model at worlds above 2: its dense gradients are
    summed by rustdist in rank order and by gloo's ring in another order (bitwise equal only
    for two terms), so there the parameters agree to float32 rounding; the sparse gradients
    alone ("sparse_only") match bit for bit at every world."""
    import torch.distributed as td

    want = _train(_gloo_group(), td, rank, model, hook, bucket_view)
    got = _train(dist.group.WORLD, dist, rank, model, hook, bucket_view)
    exact = model == "sparse_only" or world <= 2
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-6, "atol": 1e-7}
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], **tol,
                                   msg=lambda m, k=k: f"{k} differs from gloo's: {m}")
    sanity(dist, world)
