"""Bad inputs raise the documented exception with a message naming the problem, on every rank,
and leave the group usable (each case ends with a working all_reduce)."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_broadcast_src_out_of_range(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("bad_root")


@skip_if_torch("gloo segfaults on send/recv with an out-of-range peer")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_send_recv_peer_out_of_range(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("bad_peer")


@pytest.mark.parametrize("world", [1, 2])
def test_send_recv_to_self(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("send_to_self")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_all_gather_wrong_list(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("bad_all_gather_list")


@skip_if_torch("gloo aborts the process (failed CHECK) on a wrong-size output")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_wrong_output_size(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("bad_output_size")


@skip_if_torch("gloo accepts non-contiguous tensors (and its broadcast then gives wrong data)")
@pytest.mark.parametrize("world", [1, 2])
def test_non_contiguous(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("non_contiguous")


@pytest.mark.parametrize("world", [1, 2])
def test_unsupported_dtype(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("unsupported_dtype")


@skip_if_torch("gloo fails BAND on float32 asynchronously and poisons the group's next op")
@pytest.mark.parametrize("world", [1, 2])
def test_bitwise_op_on_float(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("unsupported_op")


@pytest.mark.parametrize("world", [1, 2])
def test_min_max_on_complex(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("complex_unsupported_op")


@pytest.mark.parametrize("world", [1, 2])
def test_not_a_tensor(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("not_a_tensor")
