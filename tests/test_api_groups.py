"""Process groups (new_group, subgroups, destroy, two groups in flight at once),
monitored_barrier, and TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch detection (cases in
api_cases.py). The failing monitored_barrier and DETAIL run in their own short-lived worlds."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World, skip_if_torch, skip_torch_monitored_barrier

pytestmark = pytest.mark.timeout(120)

WORLDS = [1, 2, 3, 4]


def case(name: str) -> str:
    return f"api_cases:{name}"


@pytest.mark.parametrize("world", WORLDS)
def test_new_group(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("new_group"))


@pytest.mark.parametrize("world", WORLDS)
def test_destroy_subgroup(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("destroy_subgroup"), use_destroyed=False)


@skip_if_torch("torch leaves a destroyed gloo group usable (an all_reduce on it still reduces)")
@pytest.mark.parametrize("world", [1, 3])
def test_collective_on_destroyed_subgroup_raises(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("destroy_subgroup"), use_destroyed=True)


@pytest.mark.parametrize("world,group_size", [(1, 1), (2, 1), (3, 3), (4, 2), (4, 4)])
def test_new_subgroups(worlds: Callable[[int], World], world: int, group_size: int) -> None:
    worlds(world).run(case("new_subgroups"), group_size=group_size)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_new_subgroups_by_enumeration(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("new_subgroups_by_enumeration"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_concurrent_groups(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("concurrent_groups"))


@skip_torch_monitored_barrier
@pytest.mark.parametrize("world", WORLDS)
def test_monitored_barrier(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("monitored_barrier_ok"))


@skip_torch_monitored_barrier
@pytest.mark.timeout(60)
@pytest.mark.parametrize("wait_all_ranks", [True, False])
def test_monitored_barrier_missing_ranks(short_world: Callable[..., World], wait_all_ranks: bool) -> None:
    """Ranks 1 and 3 of 4 skip the call: rank 0 raises naming rank 1 (and 3 with
    wait_all_ranks=True), rank 2 raises too, within the 2 s timeout plus slack."""
    w = short_world(4, pg_timeout=15.0)
    res = w.run(case("monitored_barrier_missing"), timeout=30, missing=[1, 3], wait_all_ranks=wait_all_ranks)
    assert [r["called"] for r in res] == [True, False, True, False]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_detail_mode_mismatch(short_world: Callable[..., World], world: int) -> None:
    """With TORCH_DISTRIBUTED_DEBUG=DETAIL set before init, shape, dtype and collective
    mismatches raise on every rank naming the ranks and what differs; the group stays usable."""
    w = short_world(world, init=False, pg_timeout=20.0)
    w.run(case("detail_init"))
    for kind in ("shape", "shape_same_numel", "dtype", "collective"):
        w.run(case("detail_mismatch"), timeout=25, kind=kind)


@skip_if_torch("gloo's DETAIL wrapper does not compare reduce ops (SUM vs MAX goes unnoticed)")
@pytest.mark.timeout(60)
def test_detail_mode_op_mismatch(short_world: Callable[..., World]) -> None:
    """With DETAIL, rank 0 reducing with MAX while the others use SUM raises on every rank."""
    w = short_world(3, init=False, pg_timeout=20.0)
    w.run(case("detail_init"))
    w.run(case("detail_mismatch"), timeout=25, kind="op")
