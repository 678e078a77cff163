"""Point-to-point: send/recv and isend/irecv, ring and pairwise, every dtype, recv's return."""

from __future__ import annotations

from typing import Callable

import pytest

from dist_cases import DTYPES
from harness import World

pytestmark = pytest.mark.timeout(150)

PATTERNS = ["send_recv_ring", "send_recv_pairwise", "isend_irecv_ring", "isend_irecv_pairwise"]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_p2p(worlds: Callable[[int], World], world: int, pattern: str, dtype: str) -> None:
    worlds(world).run(pattern, dtype=dtype)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_recv_returns_sender(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("recv_any_source")


@pytest.mark.parametrize("world", [2, 3])
def test_tags(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("tags")
