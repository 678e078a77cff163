"""``ReduceOp``: torch's own class when torch imports (so its values work everywhere), else a
small stand-in with the same names; :func:`op_code` turns either into the ``_core`` op code."""

from __future__ import annotations

import enum
from typing import Any

try:  # torch is optional: rustdist works on numpy arrays without it.
    from torch.distributed import ReduceOp
except ImportError:

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


def supports_complex(code: int) -> bool:
    """Whether the reduction with ``_core`` code ``code`` is defined on complex tensors."""
    return code not in _NOT_COMPLEX


__all__ = ["ReduceOp", "op_code", "supports_complex"]
