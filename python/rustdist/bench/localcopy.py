"""Backend ``"localcopy"``: every collective is a local copy of the same sizes, no peer
involved, and each call is recorded. ``--train fsdp2`` runs FSDP2's step on it for the
compute half of its floor (FSDP2 has no ``no_sync``), and replays the recorded collectives on
the real backend for the other half.

all_gather_into_tensor writes the rank's input into every block of the output;
reduce_scatter_tensor copies the rank's block of the input to the output; all_reduce and
broadcast leave their tensor as it is. The values are wrong, the work per element is what a
local copy costs: the step's compute is what is measured.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as td
from torch.futures import Future

from .._torch_private import WorkBase

BACKEND = "localcopy"
#: Every collective run since the last :func:`take_calls`: (op, output numel, input numel,
#: dtype name), in issue order.
_CALLS: list[tuple[str, int, int, str]] = []


class _Done(WorkBase):  # type: ignore[misc, valid-type]
    """The Work of a local copy: complete when returned."""

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._outputs)
        return fut


class LocalCopyGroup(td.ProcessGroup):  # type: ignore[misc]
    """A process group whose collectives copy locally (see the module docstring)."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._name, self._desc = "", ""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # torch names the group it registers (DeviceMesh reads it back).
    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    def _record(self, op: str, output: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
        _CALLS.append((op, output.numel(), input.numel(), str(input.dtype)))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> _Done:
        self._record("all_gather_into_tensor", output, input)
        output.view(self._size, -1).copy_(input.reshape(1, -1).expand(self._size, -1))
        return _Done([output])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> _Done:
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp)
        return _Done(list(outputs))

    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> _Done:
        self._record("reduce_scatter_tensor", output, input)
        output.view(-1).copy_(input.view(self._size, -1)[self._rank])
        return _Done([output])

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> _Done:
        for out, inp in zip(outputs, inputs):
            self._reduce_scatter_base(out, inp)
        return _Done(list(outputs))

    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def _get_backend(self, device: Any) -> LocalCopyGroup:
        return self

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _Done:
        for t in tensors:
            self._record("all_reduce", t, t)
        return _Done(list(tensors))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> _Done:
        return _Done(list(tensors))

    def barrier(self, opts: Any = None) -> _Done:
        return _Done([])


def register() -> None:
    """Registers the backend with torch.distributed (once)."""
    if not hasattr(td.Backend, BACKEND.upper()):
        td.Backend.register_backend(
            BACKEND, lambda store, rank, size, timeout: LocalCopyGroup(rank, size),
            devices=["cpu"])


def take_calls() -> list[tuple[str, int, int, str]]:
    """The collectives recorded since the last call, in issue order."""
    calls = list(_CALLS)
    _CALLS.clear()
    return calls
