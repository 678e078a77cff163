"""torch's exception types and texts (issue 25): every assertion of torch's own tests on an
error a process group (or the torch.distributed function in front of it) raises, run on every
rank of a shared world (``error_cases``): the type torch expects, torch's regex, and a working
group afterwards.

``RUSTDIST_TEST_DIST=torch`` runs the cases on gloo, which validates them; with
``RUSTDIST_TEST_BACKEND=rustdist`` they run through ``torch.distributed`` on rustdist's torch
backend, by default through ``import rustdist as dist``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from error_cases import CHECKS
from harness import World, skip_torch_monitored_barrier

pytestmark = pytest.mark.timeout(120)


def _check_params() -> list[Any]:
    """(name, world) for every check at each of its world sizes."""
    return [pytest.param(name, world, id=f"{name}-{world}")
            for name, check in CHECKS.items() for world in check.worlds]


@pytest.mark.parametrize(("name", "world"), _check_params())
def test_torch_assertion(worlds: Callable[[int], World], name: str, world: int) -> None:
    """One assertion of torch's tests (see ``error_cases.CHECKS[name].source``)."""
    worlds(world).run("error_cases:check", check=name)


@pytest.mark.parametrize("world", [1, 2])
def test_get_node_local_rank_without_env(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:node_local_rank")


@pytest.mark.parametrize("world", [1, 2])
def test_invalid_debug_level(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:debug_level_invalid")


def test_invalid_backend_config(worlds: Callable[[int], World]) -> None:
    worlds(1).run("error_cases:backend_config_invalid")


@pytest.mark.parametrize("world", [1, 2])
def test_store_get_timeout(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:store_get_timeout")


@pytest.mark.parametrize("world", [2, 3])
def test_barrier_timeout(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:barrier_timeout")


@pytest.mark.parametrize("world", [2, 3])
def test_barrier_timeout_argument(short_world: Callable[..., World], world: int) -> None:
    """Rank 0's barrier outlives the call that timed out: the world ends with the test."""
    short_world(world).run("error_cases:barrier_timeout_arg")


@skip_torch_monitored_barrier
@pytest.mark.parametrize("world", [2, 3])
def test_monitored_barrier_failed_rank(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:monitored_barrier_failed_rank")


@skip_torch_monitored_barrier
@pytest.mark.parametrize("world", [2, 3])
def test_monitored_barrier_subgroup(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:monitored_barrier_subgroup")


@pytest.mark.parametrize("world", [2, 3])
def test_monitored_barrier_rank0_timeout(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:monitored_barrier_rank0_timeout")


@skip_torch_monitored_barrier
@pytest.mark.parametrize("world", [3])
def test_monitored_barrier_failure_order(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:monitored_barrier_failure_order")


@skip_torch_monitored_barrier
@pytest.mark.parametrize("world", [2, 3])
def test_monitored_barrier_wait_all_ranks(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("error_cases:monitored_barrier_wait_all_ranks")
