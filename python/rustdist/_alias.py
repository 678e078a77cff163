"""Calls whose tensors share memory: a tensor listed twice, an output that is also an input,
overlapping views of one storage.

Every call that takes several tensors gives what it gives when each tensor is a separate copy:
inputs are read as they were when the call was made, and outputs that share memory with
another of the call's outputs are written back in the order the call lists them, once the
operation has completed (the last listed wins where they overlap). gloo gets the same for
``all_reduce_coalesced`` by flattening its inputs into one buffer and copying back; here only
the tensors that actually overlap are staged, so calls without aliasing pay one overlap check.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

#: What a call does with each of its tensors.
READ, WRITE, UPDATE = 1, 2, 3  # UPDATE: read, then written in place (all_reduce)


class Staged(NamedTuple):
    """A call's tensors with copies standing in where they share memory."""

    #: What to run the call on, slot by slot: the call's own tensor, a snapshot of an input,
    #: or a private buffer for an output.
    tensors: list[Any]
    #: ``(private buffer, the call's tensor)`` to copy back, in the call's order, once the
    #: operation has succeeded.
    back: list[tuple[Any, Any]]

    def copies(self) -> list[tuple[int, int, int]]:
        """``back`` as ``(source pointer, destination pointer, bytes)``, for the engine."""
        out = []
        for staged, x in self.back:
            (start, end), (dst, _) = _span(staged), _span(x)  # type: ignore[misc]
            out.append((start, dst, end - start))
        return out


def _span(x: Any) -> Optional[tuple[int, int]]:
    """The bytes ``[start, end)`` of a contiguous CPU or CUDA tensor or numpy array; None for
    anything else (which the call's own checks reject) and for empty ones (which share
    nothing)."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous or not x.nbytes:
            return None
        start = x.ctypes.data
        return start, start + x.nbytes
    is_contiguous = getattr(x, "is_contiguous", None)
    if is_contiguous is None or getattr(x, "is_sparse", False) or not is_contiguous():
        return None
    nbytes = x.numel() * x.element_size()
    if not nbytes:
        return None
    start = x.data_ptr()
    return start, start + nbytes


def _overlapping(spans: list[tuple[int, int, int]]) -> Optional[list[set[int]]]:
    """For ``(start, end, slot)`` spans, the slots each slot shares a byte with; None when no
    two share one (the usual case, decided in one pass over the sorted spans)."""
    spans.sort()
    reach = -1
    for start, end, _ in spans:
        if start < reach:
            break
        reach = max(reach, end)
    else:
        return None
    slots = max(s for _, _, s in spans) + 1
    shared: list[set[int]] = [set() for _ in range(slots)]
    active: list[tuple[int, int]] = []  # (end, slot) of the spans still open
    for start, end, slot in spans:
        active = [(e, s) for e, s in active if e > start]
        for _, other in active:
            shared[slot].add(other)
            shared[other].add(slot)
        active.append((end, slot))
    return shared


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x.clone()


def _empty_like(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.empty_like(x)
    return x.new_empty(x.shape)


def unalias(tensors: Sequence[Any], roles: Sequence[int]) -> Optional[Staged]:
    """None when no written tensor of the call shares memory with another of its tensors;
    else the tensors to run it on instead (see :class:`Staged`). ``roles[i]`` is ``READ``,
    ``WRITE`` or ``UPDATE`` for ``tensors[i]``.

    A read-only tensor that overlaps a written one is read from a snapshot taken now; a
    written tensor that overlaps another written one gets a private buffer (holding its
    current values when it is also read), copied back in order afterwards."""
    spans = []
    for slot, x in enumerate(tensors):
        span = _span(x)
        if span is not None:
            spans.append((span[0], span[1], slot))
    if len(spans) < 2:
        return None
    shared = _overlapping(spans)
    if shared is None:
        return None
    out = list(tensors)
    back: list[tuple[Any, Any]] = []
    for slot, x in enumerate(tensors):
        if roles[slot] & WRITE and any(roles[o] & WRITE for o in shared[slot]):
            out[slot] = _copy(x) if roles[slot] & READ else _empty_like(x)
            back.append((out[slot], x))
    staged = False
    for slot, x in enumerate(tensors):
        # An input is read from a snapshot where an output written in place overlaps it.
        if roles[slot] == READ and any(out[o] is tensors[o] and roles[o] & WRITE
                                       for o in shared[slot]):
            out[slot] = _copy(x)
            staged = True
    if not back and not staged:
        return None
    return Staged(out, back)


__all__ = ["READ", "UPDATE", "WRITE", "Staged", "unalias"]
