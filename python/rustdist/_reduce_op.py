"""``ReduceOp``: torch's own class when torch imports (so its values work everywhere), else a
small stand-in with the same names; :func:`op_code` turns either into the ``_core`` op code and
:func:`op_args` into the code and ``PREMUL_SUM``'s factor."""

from __future__ import annotations

import enum
from typing import Any, Optional

try:  # torch is optional: rustdist works on numpy arrays without it.
    from torch.distributed import ReduceOp
    from torch.distributed import _make_nccl_premul_sum as _torch_premul_sum
except ImportError:
    _torch_premul_sum = None

    class ReduceOp:  # type: ignore[no-redef]
        """An enum-like class for available reduction operations: ``SUM``, ``PRODUCT``,
        ``MIN``, ``MAX``, ``BAND``, ``BOR``, ``BXOR``, ``AVG`` and ``PREMUL_SUM``.

        ``BAND``, ``BOR`` and ``BXOR`` reductions are only defined for integer and bool
        tensors; ``AVG`` divides the sum by the world size.
        """

        class RedOpType(enum.Enum):
            """The reduction kinds, numbered as torch numbers them."""

            SUM = 0
            AVG = 1
            PRODUCT = 2
            MIN = 3
            MAX = 4
            BAND = 5
            BOR = 6
            BXOR = 7
            PREMUL_SUM = 8

        SUM = RedOpType.SUM
        AVG = RedOpType.AVG
        PRODUCT = RedOpType.PRODUCT
        MIN = RedOpType.MIN
        MAX = RedOpType.MAX
        BAND = RedOpType.BAND
        BOR = RedOpType.BOR
        BXOR = RedOpType.BXOR
        PREMUL_SUM = RedOpType.PREMUL_SUM

        def __init__(self, op: Any, factor: Optional[float] = None) -> None:
            """A reduction instance: ``op`` (a ``RedOpType``) and PREMUL_SUM's ``factor``."""
            self.op = op
            self._factor = factor

        @property
        def factor(self) -> float:
            """The factor a PREMUL_SUM multiplies each input by before summing."""
            if self._factor is None:
                raise RuntimeError("Only PREMUL_SUM supports accessing factor")
            return self._factor


_OP_TYPE: type = type(ReduceOp.SUM)

# ReduceOp value -> _core op code (see _core.pyi).
_CODES: dict[Any, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.PRODUCT: 1,
    ReduceOp.MIN: 2,
    ReduceOp.MAX: 3,
    ReduceOp.BAND: 4,
    ReduceOp.BOR: 5,
    ReduceOp.BXOR: 6,
    ReduceOp.AVG: 7,
    ReduceOp.PREMUL_SUM: 8,
}

# Reductions without a meaning on complex numbers (torch's ``supports_complex`` deny list).
_NOT_COMPLEX = frozenset(_CODES[o] for o in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT,
                                              ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR))


def op_code(op: Any) -> int:
    """The ``_core`` code of ``op``: a ``ReduceOp`` value (``ReduceOp.SUM``) or a ``ReduceOp``
    instance (``ReduceOp(ReduceOp.SUM)``, whose ``.op`` is the value)."""
    if op.__class__ is _OP_TYPE:  # plain ints compare equal to torch's values: refuse them
        return _CODES[op]
    inner = getattr(op, "op", None)
    if inner is not None and inner.__class__ is _OP_TYPE:
        return _CODES[inner]
    raise TypeError(f"op must be a ReduceOp (e.g. ReduceOp.SUM), got {op!r} of type {type(op)}")


def op_args(op: Any) -> tuple[int, Optional[float]]:
    """The ``_core`` code of ``op`` and, for ``PREMUL_SUM``, its factor (a float, or a
    one-element tensor as torch's ``_make_nccl_premul_sum`` accepts)."""
    code = op_code(op)
    if code != _CODES[ReduceOp.PREMUL_SUM]:
        return code, None
    if op.__class__ is _OP_TYPE:  # the bare enum value carries no factor
        raise ValueError(
            "ReduceOp.PREMUL_SUM needs a factor: use rustdist.make_premul_sum(factor) "
            "(or torch.distributed._make_nccl_premul_sum(factor))"
        )
    # torch before 2.12 has no ``factor`` attribute; its pickled state is (op, factor).
    factor = op.factor if hasattr(op, "factor") else op.__getstate__()[1]
    if hasattr(factor, "item"):  # torch accepts a one-element tensor as the factor
        if factor.numel() != 1:
            raise ValueError(f"PREMUL_SUM factor must be a scalar, got a tensor of shape "
                             f"{tuple(factor.shape)}")
        factor = factor.item()
    return code, float(factor)


def make_premul_sum(factor: Any) -> Any:
    """A ``ReduceOp.PREMUL_SUM`` reduction that multiplies every input by ``factor`` (a float,
    or a one-element tensor) before summing: ``sum_r(factor * x_r)``. Floating point and
    complex tensors only. Same as torch's private ``_make_nccl_premul_sum``."""
    if _torch_premul_sum is not None:
        return _torch_premul_sum(factor)
    return ReduceOp(ReduceOp.PREMUL_SUM, factor)  # type: ignore[call-arg]


_make_nccl_premul_sum = make_premul_sum


def supports_complex(code: int) -> bool:
    """Whether the reduction with ``_core`` code ``code`` is defined on complex tensors."""
    return code not in _NOT_COMPLEX


__all__ = ["ReduceOp", "_make_nccl_premul_sum", "make_premul_sum", "op_args", "op_code",
           "supports_complex"]
