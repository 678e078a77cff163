"""Every ReduceOp x dtype for all_reduce at world sizes 1-4: supported combinations give the
reference result, unsupported ones raise (ValueError for complex, as torch does) with a message
naming the op and the dtype, and the group stays usable (case all_reduce_matrix in
api_cases.py; one test per op reports every failing dtype of its row).

Expected: SUM everywhere; PRODUCT/MIN/MAX on real dtypes; BAND/BOR/BXOR on integers and bool;
AVG and PREMUL_SUM (factor 2, via dist._make_nccl_premul_sum) on floating and complex dtypes.
Under gloo, combinations gloo cannot run (AVG, PREMUL_SUM, int16, bitwise ops on floats) are
skipped inside the case; the AVG and PREMUL_SUM rows are rustdist-only."""

from __future__ import annotations

from typing import Callable

import pytest

from harness import World, skip_if_torch

pytestmark = pytest.mark.timeout(120)

GLOO_NO_SCALING = "gloo has no AVG or PREMUL_SUM"


@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR",
                                pytest.param("AVG", marks=skip_if_torch(GLOO_NO_SCALING)),
                                pytest.param("PREMUL_SUM", marks=skip_if_torch(GLOO_NO_SCALING))])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_all_reduce_op_dtype(worlds: Callable[[int], World], world: int, op: str) -> None:
    worlds(world).run("api_cases:all_reduce_matrix", op=op)


def test_premul_sum_factor_without_a_factor_attribute() -> None:
    """torch 2.11 (the GPU machine's) has no ``ReduceOp.factor``: PREMUL_SUM's factor is then
    read from the op's pickled state, ``(op, factor)``, as a float or a one-element tensor."""
    torch = pytest.importorskip("torch")
    from rustdist._reduce_op import ReduceOp, op_args

    class OpOfTorch211:
        op = ReduceOp.PREMUL_SUM

        def __init__(self, factor: object) -> None:
            self._state = (ReduceOp.PREMUL_SUM, factor)

        def __getstate__(self) -> tuple[object, object]:
            return self._state

    assert op_args(OpOfTorch211(2.5)) == (8, 2.5)
    assert op_args(OpOfTorch211(torch.tensor([0.5]))) == (8, 0.5)
