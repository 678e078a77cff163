"""rustdist's operations in torch.profiler through both front doors (the import swap, and
torch.distributed with backend "rustdist"): every operation, synchronous and asynchronous,
with torch's communication metadata, in the events and in the exported Chrome trace
(cases in profile_cases.py)."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import BACKEND, IS_TORCH, World

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(IS_TORCH and BACKEND == "gloo",
                       reason="rustdist's profiler events: gloo writes its own (gloo:*)"),
]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("autograd", [False, True], ids=["torch.profiler", "autograd.profiler"])
def test_every_operation_is_an_event_with_its_metadata(worlds: Callable[[int], World],
                                                       world: int, autograd: bool) -> None:
    counts = worlds(world).run("profile_cases:profiled_ops", autograd=autograd)
    assert all(c["async=True"] == c["async=False"] for c in counts), counts


@pytest.mark.parametrize("world", [2, 3])
def test_an_async_event_spans_until_the_operation_completes(worlds: Callable[[int], World],
                                                            world: int) -> None:
    margins = worlds(world).run("profile_cases:profiled_p2p_spans_completion")
    assert margins[0] is not None and margins[0] > 0, margins


@pytest.mark.parametrize("world", [2])
def test_no_profiler_no_events(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("profile_cases:unprofiled_ops_record_nothing")
