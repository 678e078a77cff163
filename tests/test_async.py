"""async_op=True: Work.wait/is_completed/is_success, futures and .then(), several in flight."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_async_ops(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("async_ops")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_async_future(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("async_future")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_async_reverse_wait(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("async_reverse")
