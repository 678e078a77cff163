"""The argument checks of torch's gloo backend (``ProcessGroupGloo``), which torch's tests
assert on the backend object: RuntimeError with gloo's text after the method's name. The torch
front door's methods make them before anything runs, so every rank that makes the same bad
call raises."""

from __future__ import annotations

from typing import Any

from ._tensor import SparseInput, unsupported

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]


def _invalid(op: str, what: str) -> RuntimeError:
    """The error of method ``op`` for an invalid argument, ``what`` in gloo's words."""
    return RuntimeError(f"{op}: {what}")


def _layout_error(op: str, i: int, expected: Any, got: Any) -> RuntimeError:
    """gloo's error for tensor ``i`` of layout ``got`` among tensors of layout ``expected``; a
    NotImplementedError (``_tensor.SparseInput``) when one is sparse, as torch's dispatcher
    refuses sparse tensors for these ops before gloo sees them."""
    error = _invalid(op, f"invalid tensor layout at index {i} (expected {expected}, got {got})")
    if torch is not None and torch.sparse_coo in (expected, got):
        return SparseInput(str(error))
    return error


def check_root(op: str, root: int, size: int, root_tensor: int, count: int) -> None:
    """The root rank is a group rank, and the root tensor an index of the ``count`` tensors."""
    if not 0 <= root < size:
        raise _invalid(op, f"invalid root rank: {root}")
    if not 0 <= root_tensor < count:
        raise _invalid(op, f"invalid root tensor: {root_tensor}")


def check_alike(op: str, tensors: Any, first: Any, sizes: bool = True) -> None:
    """Every tensor of ``tensors`` has the layout, dtype and device (and with ``sizes`` the
    element count: rustdist takes other shapes of as many elements) of ``first``."""
    for i, t in enumerate(tensors):
        if t.layout != first.layout:
            raise _layout_error(op, i, first.layout, t.layout)
        if t.dtype != first.dtype or t.device != first.device:
            raise _invalid(op, f"invalid tensor type at index {i} (expected {first.dtype} on "
                               f"{first.device}, got {t.dtype} on {t.device})")
        if sizes and t.numel() != first.numel():
            raise _invalid(op, f"invalid tensor size at index {i} (expected "
                               f"{tuple(first.shape)}, got {tuple(t.shape)})")


def check_allreduce(tensors: Any) -> None:
    """``allreduce``: a non-empty list of tensors alike (one tensor is the usual call)."""
    if len(tensors) != 1:
        if not tensors:
            raise _invalid("allreduce", "requires non-empty tensor list")
        check_alike("allreduce", tensors, tensors[0])


def check_allreduce_coalesced(tensors: Any) -> None:
    """``allreduce_coalesced``: a non-empty list of dense tensors of one dtype and layout."""
    op = "allreduce_coalesced"
    if not tensors:
        raise _invalid(op, "requires non-empty tensor list")
    first = tensors[0]
    for i, t in enumerate(tensors):  # gloo looks at the layouts first
        if t.layout != first.layout:
            raise _layout_error(op, i, first.layout, t.layout)
    for i, t in enumerate(tensors):
        if t.dtype != first.dtype:
            raise _invalid(op, f"tensors must all have the same type (index {i} is {t.dtype}, "
                               f"index 0 {first.dtype})")
    if torch is not None and first.layout is torch.sparse_coo:
        error = unsupported("tensors", "all_reduce_coalesced")
        raise type(error)(f"{op}: unsupported layout: {error}")


def check_reduce(tensors: Any, opts: Any, size: int) -> None:
    """``reduce``: a root in the group and one tensor."""
    check_root("reduce", opts.rootRank, size, getattr(opts, "rootTensor", 0), len(tensors))
    if len(tensors) != 1:
        raise _invalid("reduce", "requires a single-element tensor list")


def check_allgather(outputs: Any, inputs: Any, size: int) -> None:
    """``allgather``: one output list of ``size`` tensors per input, all of the inputs'
    dtype. Output blocks may differ in size from the input (uneven all_gather; the engine
    checks the own block)."""
    op = "allgather"
    if not inputs:
        raise _invalid(op, "requires non-empty input tensor list")
    if len(inputs) != len(outputs):
        raise _invalid(op, "requires input/output tensor lists to have the same length")
    expected = len(inputs) * size
    for i, out in enumerate(outputs):
        if len(out) != expected:
            raise _invalid(op, f"invalid output tensor list at index {i} (expected length "
                               f"{expected}, got {len(out)})")
    check_alike(op, inputs, inputs[0])
    for out in outputs:
        check_alike(op, out, inputs[0], sizes=False)


def check_rooted(op: str, opts: Any, rank: int, size: int, singles: Any, lists: Any) -> None:
    """``gather`` (``singles`` the inputs, ``lists`` the outputs) and ``scatter`` (``singles``
    the outputs, ``lists`` the inputs): one tensor on every rank, one list of ``size`` tensors
    like it on the root, none elsewhere."""
    single, side = ("input", "output") if op == "gather" else ("output", "input")
    root = opts.rootRank
    if not 0 <= root < size:
        raise _invalid(op, f"invalid root rank: {root}")
    if len(singles) != 1:
        raise _invalid(op, f"requires a single-element {single} tensor list")
    if rank != root:
        if lists:
            raise _invalid(op, f"requires empty {side} on non-root")
        return
    if len(lists) != 1:
        raise _invalid(op, f"requires a single-element {side} list containing a list with "
                           f"{size} tensors.")
    if len(lists[0]) != size:
        raise _invalid(op, f"Incorrect {side} list size {len(lists[0])}. {side.capitalize()} "
                           f"list size should be {size}, same as size of the process group.")
    check_alike(op, lists[0], singles[0])


__all__ = ["check_allgather", "check_alike", "check_allreduce", "check_allreduce_coalesced",
           "check_reduce", "check_root", "check_rooted"]
