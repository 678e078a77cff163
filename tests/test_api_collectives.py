"""reduce (every dst), gather, scatter, uneven all_gather, reduce_scatter (list form),
all_to_all, all_to_all_single (equal and unequal splits), the coalesced collectives, complex
tensors, PREMUL_SUM and half-precision sums (f32 accumulation), at world sizes 1-4, against
torch references and the documented examples (cases in api_cases.py)."""

from __future__ import annotations

import os
from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(120)

WORLDS = [1, 2, 3, 4]
ROOTS = [(w, r) for w in WORLDS for r in range(w)]
GLOO_NO_AVG = "gloo has no ReduceOp.AVG"


def case(name: str) -> str:
    return f"api_cases:{name}"


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX",
                                pytest.param("AVG", marks=skip_if_torch(GLOO_NO_AVG))])
@pytest.mark.parametrize("world,dst", ROOTS)
def test_reduce(worlds: Callable[[int], World], world: int, dst: int, op: str) -> None:
    worlds(world).run(case("reduce"), op=op, dst=dst)


@pytest.mark.parametrize("world,dst", ROOTS)
def test_gather(worlds: Callable[[int], World], world: int, dst: int) -> None:
    worlds(world).run(case("gather"), dst=dst)


@pytest.mark.parametrize("world,src", ROOTS)
def test_scatter(worlds: Callable[[int], World], world: int, src: int) -> None:
    worlds(world).run(case("scatter"), src=src)


def test_gather_scatter_doc_example(worlds: Callable[[int], World]) -> None:
    worlds(2).run(case("gather_scatter_doc_example"))


@skip_if_torch("gloo's allgather rejects tensors of different sizes ('invalid tensor size')")
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_uneven(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("all_gather_uneven"))


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX",
                                pytest.param("AVG", marks=skip_if_torch(GLOO_NO_AVG))])
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_list(worlds: Callable[[int], World], world: int, op: str) -> None:
    worlds(world).run(case("reduce_scatter_list"), op=op)


GLOO_A2A_UNEVEN = "gloo's alltoall rejects blocks of different sizes ('invalid tensor size')"


@pytest.mark.parametrize("uneven", [False, pytest.param(True, marks=skip_if_torch(GLOO_A2A_UNEVEN))],
                         ids=["equal", "uneven"])
@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all(worlds: Callable[[int], World], world: int, uneven: bool) -> None:
    worlds(world).run(case("all_to_all"), uneven=uneven)


@pytest.mark.parametrize("world", WORLDS)
def test_large_transfers(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("large_transfers"))


@pytest.mark.parametrize("uneven", [False, True], ids=["equal", "uneven"])
@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_single(worlds: Callable[[int], World], world: int, uneven: bool) -> None:
    worlds(world).run(case("all_to_all_single"), uneven=uneven)


@pytest.mark.parametrize("part", ["single", "list_equal",
                                  pytest.param("list_uneven", marks=skip_if_torch(GLOO_A2A_UNEVEN))])
def test_all_to_all_doc_example(worlds: Callable[[int], World], part: str) -> None:
    worlds(4).run(case("all_to_all_doc_example"), part=part)


@pytest.mark.parametrize("world", WORLDS)
def test_coalesced(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("coalesced"))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("world", WORLDS)
def test_complex_api(worlds: Callable[[int], World], world: int, dtype: str) -> None:
    worlds(world).run(case("complex_api"), dtype=dtype)


@skip_if_torch("gloo has no PREMUL_SUM")
@pytest.mark.parametrize("world", WORLDS)
def test_premul_sum(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("premul_sum_api"))


@pytest.mark.skipif(os.environ.get("RUSTDIST_SHM") == "0" or bool(os.environ.get(
    "RUSTDIST_TEST_HOSTS")), reason="half-precision sums accumulate in f32 where one rank reads "
    "every contribution (shared memory, one host); across TCP each hop rounds, as in gloo's "
    "and NCCL's rings")
@pytest.mark.parametrize("world", [3, 4])
def test_half_precision_sums_round_once(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("half_sums_round_once"))
