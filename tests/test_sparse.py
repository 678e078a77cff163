"""Sparse COO tensors (issue 25): all_reduce with ReduceOp.SUM as gloo runs it (coalesced and
uncoalesced inputs, different nnz per rank including none, hybrid and 3-D tensors, dtypes,
async Works whose result and future hold the input tensor), the errors gloo raises (other
reduce ops, mismatched shapes, a leaf that requires grad, every other collective), and DDP
with sparse embedding gradients (with and without gradient_as_bucket_view, with DDP's
allreduce hook and a custom hook) training to exactly gloo's parameters; worlds 1-4, cases in
sparse_cases.py. Runs in every harness mode: rustdist (import-swap door), torch with gloo
(validates the expectations) and torch with the "rustdist" backend (torch door)."""

from __future__ import annotations

from typing import Callable, Optional

import pytest

from harness import BACKEND, World

pytestmark = pytest.mark.timeout(120)

WORLDS = [1, 2, 3, 4]
KINDS = ["coalesced", "uncoalesced", "some_empty", "all_empty", "hybrid", "cancel", "three_d",
         "single"]
#: int16: gloo has no int16 collectives (its sparse allreduce raises "Invalid scalar type").
DTYPES = ["float64", "bfloat16", "int64", "int32", "int8", "uint8"] + (
    [] if BACKEND == "gloo" else ["int16"])
OPS = ["PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
P2P = {"send", "isend", "recv", "irecv"}


def case(name: str) -> str:
    return f"sparse_cases:{name}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce(worlds: Callable[[int], World], world: int, kind: str) -> None:
    worlds(world).run(case("all_reduce"), kind=kind)


@pytest.mark.parametrize("mode", ["async", "explicit_op"])
@pytest.mark.parametrize("kind", ["uncoalesced", "some_empty"])
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_async_and_op(worlds: Callable[[int], World], world: int, kind: str,
                                 mode: str) -> None:
    worlds(world).run(case("all_reduce"), kind=kind, mode=mode)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_dtypes(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run(case("all_reduce"), kind="uncoalesced", dtype=dtype)


@pytest.mark.parametrize("dtype", ["float16", "bool"])
@pytest.mark.parametrize("world", WORLDS)
def test_dtype_without_sparse_add(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run(case("dtype_unsupported_by_sparse_add"), dtype=dtype)


@pytest.mark.parametrize("world", WORLDS)
def test_complex(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("complex"))


@pytest.mark.parametrize("world", WORLDS)
def test_in_place(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("all_reduce_in_place"))


@pytest.mark.parametrize("world", WORLDS)
def test_repeated_and_interleaved(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("repeated"))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_other_reduce_op_raises(worlds: Callable[[int], World], world: int, op: str) -> None:
    worlds(world).run(case("other_op"), op=op)


@pytest.mark.parametrize("how", [
    "size",
    pytest.param("split", marks=pytest.mark.skipif(
        BACKEND == "gloo", reason="gloo checks only the sizes: a different sparse/dense split "
        "with equal sizes aborts its process (collective size mismatch)")),
])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shape_mismatch_raises(worlds: Callable[[int], World], world: int, how: str) -> None:
    worlds(world).run(case("shape_mismatch"), how=how)


@pytest.mark.parametrize("world", WORLDS)
def test_leaf_requires_grad_raises(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("leaf_requires_grad"))


OTHER = [(w, op) for w in WORLDS for op in
         ["broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
          "reduce_scatter", "gather", "scatter", "all_to_all", "all_to_all_single",
          "all_reduce_coalesced", "all_reduce_coalesced_2", "send", "isend", "recv", "irecv"]
         if w > 1 or op not in P2P]  # a world of 1 has no peer


@pytest.mark.parametrize("world,op", OTHER)
def test_other_collective_raises(worlds: Callable[[int], World], world: int, op: str) -> None:
    worlds(world).run(case("other_collective"), op=op)


HOOKS = [None, "allreduce", "custom"]
#: (model, hook, gradient_as_bucket_view): the bucket view matters for dense buckets only.
DDP = ([("sparse_only", hook, False) for hook in HOOKS]
       + [("mixed", hook, view) for hook in HOOKS for view in (False, True)])


@pytest.mark.parametrize("model,hook,bucket_view", DDP,
                         ids=[f"{m}-{h or 'no'}_hook-{'bucket_view' if v else 'copy'}"
                              for m, h, v in DDP])
@pytest.mark.parametrize("world", WORLDS)
def test_ddp_sparse_matches_gloo(worlds: Callable[[int], World], world: int, model: str,
                                 hook: Optional[str], bucket_view: bool) -> None:
    worlds(world).run(case("ddp"), model=model, hook=hook, bucket_view=bucket_view)
