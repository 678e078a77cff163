"""Torch tensors and numpy arrays as zero-copy ``(data pointer, element count, dtype code)``
buffers for ``_core`` (dtype codes as in ``_core.pyi``)."""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]

# A buffer as _core takes it: (data pointer, element count, dtype code).
Buf = tuple[int, int, int]

_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "bool", "complex64", "complex128")
COMPLEX_CODES = frozenset((10, 11))
ITEMSIZE = (4, 8, 2, 2, 1, 2, 4, 8, 1, 1, 8, 16)  # bytes per element, by dtype code

_NP_CODES: dict[Any, int] = {np.dtype(n): c for c, n in enumerate(_NAMES) if n != "bfloat16"}
_ndarray = np.ndarray

_Tensor: Any = None
_TORCH_CODES: dict[Any, int] = {}
_STRIDED: Any = None
if torch is not None:
    _Tensor = torch.Tensor
    _TORCH_CODES = {getattr(torch, n): c for c, n in enumerate(_NAMES)}
    _STRIDED = torch.strided
#: The dtypes that take the short paths; complex tensors take the checked one (conjugate bit).
REAL_TORCH_CODES = {dtype: code for dtype, code in _TORCH_CODES.items()
                    if code not in COMPLEX_CODES}


class OnCuda(RuntimeError):
    """Raised by :func:`buffer` for a CUDA tensor where the call runs on CPU tensors (its
    other tensors are: :func:`routed` sends calls on CUDA tensors to rustdist.cuda)."""


class SparseInput(NotImplementedError):
    """Raised by :func:`buffer` for a sparse COO tensor. ``all_reduce`` catches it and
    runs ``_sparse.all_reduce``; from any other collective it reaches the caller, naming the
    operation, like torch's error for gloo (``NotImplementedError: Could not run
    'c10d::broadcast_' with arguments from the 'SparseCPU' backend``)."""


def _op_name() -> str:
    """The rustdist API function that was called: the innermost public function (or public
    class, for ``P2POp(...)``) of a rustdist module on the stack, outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("rustdist"):
        name = frame.f_code.co_name
        if frame.f_globals["__name__"] == __name__:
            frame = frame.f_back
            continue
        if not name.startswith(("_", "<")):
            return name
        if name in ("__new__", "__init__"):  # a class: its name (co_qualname is 3.11+)
            owner = frame.f_locals.get("cls", frame.f_locals.get("self"))
            return getattr(owner, "__name__", None) or type(owner).__name__
        frame = frame.f_back
    return "this operation"


def unsupported(name: str, op: Optional[str] = None) -> SparseInput:
    """The error for sparse tensor ``name`` given to operation ``op``, which does not take
    sparse tensors (by default the operation is read from the stack: the caller is
    :func:`buffer`)."""
    return SparseInput(
        f"rustdist's {op or _op_name()} does not support sparse tensors: `{name}` is "
        "torch.sparse_coo (as with torch.distributed's gloo backend, only all_reduce with "
        "ReduceOp.SUM takes sparse COO tensors)"
    )


def torch_code(x: Any, name: str) -> int:
    """The dtype code of torch tensor ``x``. Raises for an unsupported dtype and for a
    conjugate view, whose memory holds the unconjugated values: torch.distributed raises for
    it too (through ``view_as_real``)."""
    code = _TORCH_CODES.get(x.dtype)
    if code is None:
        raise RuntimeError(f"Invalid scalar type: rustdist does not support {x.dtype}")
    if code in COMPLEX_CODES and x.is_conj():
        raise RuntimeError(f"`{name}` is a conjugate view (its conjugate bit is set); resolve "
                           f"it first with .resolve_conj(), which returns a copy, not a view")
    return code


def not_contiguous(name: str) -> ValueError:
    """The error for a non-contiguous ``name``: torch's type and text ("Tensors must be
    contiguous", the check of its backends' single-tensor ops), then which argument."""
    return ValueError(f"Tensors must be contiguous: `{name}` is not (.contiguous() makes a "
                      "contiguous copy)")


def buffer(x: Any, name: str, out: bool = False) -> Buf:
    """The buffer of ``x``, a contiguous CPU tensor or array of a supported dtype; ``out``
    when the op writes into it. Raises what torch raises otherwise, naming ``name``, and
    :class:`OnCuda` for a CUDA tensor."""
    if x.__class__ is _Tensor:  # the hot path: a plain real tensor
        code = REAL_TORCH_CODES.get(x.dtype)
        if code is not None and x.is_cpu and x.is_contiguous():
            return x.data_ptr(), x.numel(), code
    if _Tensor is not None and isinstance(x, _Tensor):
        if not x.is_cpu:
            if x.is_cuda:
                raise OnCuda(f"`{name}` is a CUDA tensor: this operation runs on CPU tensors "
                             "only; move it with .cpu()")
            raise RuntimeError(f"rustdist only supports CPU tensors, `{name}` is on {x.device}")
        if x.layout is not _STRIDED:
            if x.layout is torch.sparse_coo:  # all_reduce takes it (see _sparse)
                raise unsupported(name)
            raise RuntimeError(f"rustdist only supports dense tensors, `{name}` is {x.layout}")
        code = torch_code(x, name)
        if not x.is_contiguous():
            raise not_contiguous(name)
        return x.data_ptr(), x.numel(), code
    if isinstance(x, _ndarray):
        code = _NP_CODES.get(x.dtype)
        if code is None:
            raise RuntimeError(f"Invalid scalar type: rustdist does not support {x.dtype}")
        if not x.flags.c_contiguous:
            raise not_contiguous(name)
        if out and not x.flags.writeable:
            raise ValueError(f"`{name}` is a read-only array; the collective writes into it")
        return x.ctypes.data, x.size, code
    raise TypeError(
        f"Invalid function argument. Expected parameter `{name}` of type torch.Tensor "
        f"or numpy.ndarray but got {type(x)} instead."
    )


def routed(x: Any, name: str, out: bool = False) -> Optional[Buf]:
    """:func:`buffer` for the tensor that decides where a call runs: None for a CUDA tensor,
    whose call the caller hands to ``rustdist.cuda``."""
    if getattr(x, "is_cuda", False):
        return None
    return buffer(x, name, out)


def concat(xs: list[Any]) -> Any:
    """The elements of ``xs`` (all torch tensors or all numpy arrays) in one new flat
    contiguous tensor or array, in order."""
    if _Tensor is not None and isinstance(xs[0], _Tensor):
        return torch.cat([x.reshape(-1) for x in xs])
    return np.concatenate([np.ravel(x) for x in xs])


def dim0(x: Any) -> int:
    """The length of ``x``'s dimension 0 (1 for a 0-dim tensor): what torch's split sizes
    split."""
    shape = x.shape
    return shape[0] if len(shape) else 1


__all__ = ["Buf", "COMPLEX_CODES", "ITEMSIZE", "OnCuda", "SparseInput", "buffer", "concat",
           "dim0", "routed", "unsupported"]
