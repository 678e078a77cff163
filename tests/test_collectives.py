"""Every collective x dtype x ReduceOp at world sizes 1-4, checked element by element.

Each test runs one case in the shared world of that size; the case loops over tensor shapes
(``dist_cases.SHAPES``: empty, tiny, both sides of the shared-memory inline size, (2, 3), past
one shared-memory slot) and checks every rank's result exactly. ``./dev test`` runs it on
shared memory, on TCP (``RUSTDIST_SHM=0``) and split over two host identities.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

from dist_cases import DTYPES, FLOAT_DTYPES
from harness import (
    BACKEND, HOSTS_SPEC, IS_TORCH, World, parse_hosts_spec, placement, rustdist_only, skip_if_torch,
)

pytestmark = pytest.mark.timeout(150)

WORLDS = [1, 2, 3, 4]
OPS = ["SUM", "PRODUCT", "MIN", "MAX"]
GLOO_NO_INT16 = "gloo has no int16 collectives (it raises 'Invalid scalar type')"


def dtype_params(dtypes: list[str] = list(DTYPES)) -> list[Any]:
    """Dtype parameters; int16 is rustdist-only because gloo cannot reduce/gather it."""
    return [pytest.param(d, marks=skip_if_torch(GLOO_NO_INT16)) if d == "int16" else d for d in dtypes]


@rustdist_only
@pytest.mark.parametrize("world", WORLDS)
def test_link(worlds: Callable[[int], World], world: int) -> None:
    """The run's layout is in effect: shared memory by default, TCP with RUSTDIST_SHM=0 or one
    rank per host, shared memory inside hosts and TCP across when RUSTDIST_TEST_HOSTS puts
    several ranks on some hosts."""
    host_of = placement(world, *parse_hosts_spec(HOSTS_SPEC)) if HOSTS_SPEC else [0] * world
    hosts = len(set(host_of))
    if hosts == world or os.environ.get("RUSTDIST_SHM") == "0":
        expected = "tcp"
    else:
        expected = "shm" if hosts == 1 else "hierarchical"
    worlds(world).run("link", expected=expected)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce(worlds: Callable[[int], World], world: int, op: str, dtype: str) -> None:
    worlds(world).run("all_reduce", dtype=dtype, op=op)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_avg(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("all_reduce", dtype=dtype, op="AVG")


@pytest.mark.parametrize("dtype", dtype_params(["int8", "int16", "int32", "int64", "uint8", "bool"]))
@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_bitwise(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("bitwise_ops", dtype=dtype)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("world,src", [(w, s) for w in WORLDS for s in range(w)])
def test_broadcast(worlds: Callable[[int], World], world: int, src: int, dtype: str) -> None:
    worlds(world).run("broadcast", dtype=dtype, src=src)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("all_gather", dtype=dtype)


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_into_tensor_flat(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("all_gather_into_tensor", dtype=dtype, layout="flat")


@skip_if_torch("gloo rejects the stacked (world, *shape) output ('invalid tensor size')")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_into_tensor_stacked(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("all_gather_into_tensor", dtype=dtype, layout="stacked")


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_tensor(worlds: Callable[[int], World], world: int, op: str, dtype: str) -> None:
    worlds(world).run("reduce_scatter_tensor", dtype=dtype, op=op)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_tensor_avg(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("reduce_scatter_tensor", dtype=dtype, op="AVG")


@skip_if_torch("gloo aborts the process on a stacked (world, *shape) reduce_scatter input")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_tensor_stacked(worlds: Callable[[int], World], world: int, op: str) -> None:
    for dtype in ("float32", "int64", "bfloat16"):
        worlds(world).run("reduce_scatter_tensor", dtype=dtype, op=op, layout="stacked")


@pytest.mark.parametrize("world", WORLDS)
def test_barrier(worlds: Callable[[int], World], world: int, tmp_path: Any) -> None:
    worlds(world).run("barrier", directory=str(tmp_path))


@pytest.mark.parametrize("world", WORLDS)
def test_group_world_argument(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("group_world_argument")


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int64", "bool"])
@pytest.mark.parametrize("world", WORLDS)
def test_views(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    """Collectives on views that start inside a larger buffer, 0-dim and with size-1 dims."""
    worlds(world).run("views", dtype=dtype)


@pytest.mark.skipif(IS_TORCH and BACKEND == "gloo",
                    reason="gloo's all_to_all_single gives wrong data when the output shares "
                    "memory with the input (seen at worlds 2-4)")
@pytest.mark.parametrize("world", WORLDS)
def test_aliased_buffers(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("aliased")


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("world", [2, 3])
def test_complex(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run("complex", dtype=dtype)


@pytest.mark.skipif(IS_TORCH, reason="rustdist-only: checks that rustdist accepts torch.distributed.ReduceOp "
                    "(trivially true for torch itself)")
@pytest.mark.parametrize("world", [2])
def test_torch_reduce_op_accepted(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("torch_reduce_op")
