"""Calls whose tensors share memory give what separate copies give (issue 25): random aliasing
patterns for every multi-tensor call at worlds 1-4, synchronous and asynchronous, compared
element by element with a copy-based reference (cases in alias_cases.py)."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import BACKEND, IS_TORCH, World, skip_if_torch

pytestmark = pytest.mark.timeout(240)

WORLDS = [1, 2, 3, 4]
TRIALS = 24
ON_GLOO = IS_TORCH and BACKEND == "gloo"


def not_on_gloo(what: str) -> pytest.MarkDecorator:
    """gloo (RUSTDIST_TEST_DIST=torch, which validates the cases) fails `what`; rustdist's two
    doors run it."""
    return pytest.mark.skipif(ON_GLOO, reason=f"gloo {what}")


OPS = ["all_reduce_coalesced", "allreduce_coalesced_method", "broadcast_method", "all_gather",
       "all_gather_coalesced", "all_to_all", "gather",
       pytest.param("scatter", marks=not_on_gloo("scatters wrong data into an output that "
                                                  "overlaps its scatter_list")),
       pytest.param("reduce_scatter", marks=not_on_gloo(
           "refuses an output inside its input list ('unsupported operation: ... refer to a "
           "single memory location')")),
       "reduce_scatter_tensor", "all_gather_into_tensor",
       pytest.param("all_to_all_single", marks=not_on_gloo(
           "returns wrong data when the output overlaps the input")),
       pytest.param("allgather_into_tensor_coalesced", marks=not_on_gloo(
           "hangs (times out after 30 s) when an output overlaps another pair's input")),
       "reduce_scatter_tensor_coalesced"]
GLOO_P2P = "sends from the tensor's memory after a receive posted later has written into it"


def case(name: str) -> str:
    return f"alias_cases:{name}"


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", WORLDS)
def test_alias_property(worlds: Callable[[int], World], world: int, op: str,
                        async_op: bool) -> None:
    aliased = worlds(world).run(case("alias_property"), op=op, trials=TRIALS, seed=25,
                                async_op=async_op)
    # The draw must exercise aliasing, or the test proves nothing.
    assert all(a > 0 for a in aliased), aliased


@not_on_gloo(GLOO_P2P)
@skip_if_torch("torch.distributed.batch_isend_irecv posts the operations one by one for every "
               "backend but NCCL, so the backend never sees the batch (a send posted after a "
               "receive into its memory has landed reads what arrived); "
               "test_send_then_receive_into_it covers the single operations")
@pytest.mark.parametrize("world", [2, 3, 4])
def test_alias_property_batch_isend_irecv(worlds: Callable[[int], World], world: int) -> None:
    aliased = worlds(world).run(case("alias_property"), op="batch_isend_irecv", trials=TRIALS,
                                seed=25, async_op=True)
    assert all(a > 0 for a in aliased), aliased


@skip_if_torch("torch.distributed takes torch tensors only; rustdist also numpy arrays")
@pytest.mark.parametrize("op", ["all_reduce_coalesced", "all_gather", "all_to_all", "scatter"])
@pytest.mark.parametrize("world", [1, 3])
def test_alias_property_numpy(worlds: Callable[[int], World], world: int, op: str) -> None:
    aliased = worlds(world).run(case("alias_property"), op=op, trials=TRIALS, seed=26,
                                as_numpy=True)
    assert all(a > 0 for a in aliased), aliased


@pytest.mark.parametrize("world", WORLDS)
def test_all_reduce_coalesced_repeated_tensor(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run(case("all_reduce_coalesced_repeated"))



@not_on_gloo(GLOO_P2P)
@pytest.mark.parametrize("n", [3, 1 << 21])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_send_then_receive_into_it(worlds: Callable[[int], World], world: int, n: int) -> None:
    worlds(world).run(case("send_then_receive_into_it"), n=n)
