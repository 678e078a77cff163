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
