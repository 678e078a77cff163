"""Object collectives, P2POp + batch_isend_irecv, isend/irecv to self, recv(src=None) with
tags (cases in api_cases.py)."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(120)

WORLDS = [1, 2, 3, 4]


def case(name: str) -> str:
    return f"api_cases:{name}"


@pytest.mark.parametrize("world,root", [(w, r) for w in WORLDS for r in range(w)])
def test_object_collectives(worlds: Callable[[int], World], world: int, root: int) -> None:
    worlds(world).run(case("objects"), root=root)


def test_object_doc_examples(worlds: Callable[[int], World]) -> None:
    worlds(3).run(case("objects_doc_example"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_batch_isend_irecv_doc_example(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("batch_doc_example"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_batch_isend_irecv_pairwise(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("batch_pairwise"))


@pytest.mark.parametrize("world", [1, 2])
def test_p2pop_invalid(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("p2pop_invalid"))


@skip_if_torch("gloo has no connection from a rank to itself ('Pair is not connected')")
@pytest.mark.parametrize("world", [1, 2])
def test_isend_irecv_to_self(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("self_send"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_recv_any_source_with_tags(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("recv_any_tagged"))
