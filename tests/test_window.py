"""torch 2.14's one-sided windows on rustdist groups (issue 50): puts at offsets checked
element by element in every dtype, signals and waits synchronous and asynchronous,
``map_remote_tensor`` aliasing, numpy arrays, misuse, 1,000 windows without a leak, and a dead
peer named on its waiters, at worlds 1-4 through the harness's door. On one host with shared
memory access is UNIFIED; with ``RUSTDIST_SHM=0`` and on the test hosts (TLS too) it is
SEPARATE, puts and signals carried on the links. Cases in window_cases.py."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from harness import IS_TORCH, World

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(IS_TORCH and not hasattr(torch.distributed, "_new_window"),
                       reason=f"torch {torch.__version__} has no window API (2.14+): rustdist's "
                       "own _new_window runs on the import-swap door"),
]

WINDOW_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64",
                 "uint8", "bool", "complex64"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_put_signal_wait_every_dtype(worlds: Callable[[int], World], world: int) -> None:
    for i, dtype in enumerate(WINDOW_DTYPES):
        for async_op in (False, True):
            worlds(world).run("window_cases:window_put_signal", dtype=dtype,
                              async_op=async_op, seed=i)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_writes_through_a_mapped_peer_tensor(worlds: Callable[[int], World], world: int,
                                              tmp_path: Path) -> None:
    worlds(world).run("window_cases:window_write_through_map",
                      dump_prefix=str(tmp_path / "window-trace-"))


@pytest.mark.skipif(IS_TORCH, reason="numpy arrays go through the import-swap door only")
@pytest.mark.parametrize("world", [1, 3])
def test_numpy_windows(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("window_cases:window_numpy")


@pytest.mark.parametrize("world", [1, 3])
def test_misuse_raises_and_writes_nothing(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("window_cases:window_misuse")


@pytest.mark.parametrize("world", [2, 3])
def test_puts_land_while_the_target_calls_nothing(worlds: Callable[[int], World], world: int,
                                                   tmp_path: Path) -> None:
    worlds(world).run("window_cases:window_idle_target", store_path=str(tmp_path / "store"))


@pytest.mark.parametrize("world", [2, 3])
def test_a_lone_put_lands_without_a_signal(worlds: Callable[[int], World], world: int,
                                           tmp_path: Path) -> None:
    worlds(world).run("window_cases:window_lone_put", store_path=str(tmp_path / "store"))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_deregister_then_destroy_loses_no_put(worlds: Callable[[int], World],
                                              world: int) -> None:
    worlds(world).run("window_cases:window_deregister_then_leave", rounds=20)


def test_a_thousand_windows_leak_nothing(worlds: Callable[[int], World]) -> None:
    worlds(2).run("window_cases:window_churn", windows=1000, timeout=150)


def test_a_dead_peer_is_named_on_its_waiters(short_world: Callable[..., World]) -> None:
    world = short_world(3, pg_timeout=20.0)
    world.submit("window_cases:window_dead_peer", victim=2)
    errors = world.collect([0, 1], "window_cases:window_dead_peer", timeout=60)
    assert all("rank 2" in e for e in errors), errors


def test_a_destroyed_group_s_window_refuses_work(short_world: Callable[..., World]) -> None:
    short_world(2).run("window_cases:window_after_destroy")
