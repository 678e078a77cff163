"""numpy arrays as inputs and outputs of every collective and of isend/irecv."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(150)


@skip_if_torch("torch.distributed accepts torch.Tensor only")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_numpy_inputs(worlds: Callable[[int], World], world: int) -> None:
    worlds(world).run("numpy")
