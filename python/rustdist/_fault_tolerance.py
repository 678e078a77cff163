"""torch 2.14's fault-tolerance and one-sided queries on the import-swap door:
``_supports_reconfigure``, ``_get_reconfigure_handle``, ``_reconfigure`` and
``_supports_window``, with torch's signatures, on rustdist groups (torch tensors or numpy
arrays alike). Each resolves ``group`` (None: the default group) and asks the group, as
torch's functions of these names do."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional, Union

from ._group import ProcessGroup
from ._work import Work
from ._world import resolve


def _group(group: Optional[ProcessGroup]) -> ProcessGroup:
    pg = resolve(group)
    if pg is None:
        raise ValueError("Invalid process group specified: this rank is not a member")
    return pg


def _supports_reconfigure(group: Optional[ProcessGroup] = None) -> bool:
    """
    Return whether ``group`` supports the reconfigure-based fault tolerance API.

    Args:
        group (ProcessGroup, optional): The process group to query. If ``None``,
            the default process group is used.
    """
    return _group(group).supports_reconfigure


def _get_reconfigure_handle(group: Optional[ProcessGroup] = None) -> str:
    """
    Return an opaque reconfigure handle for ``group``.

    The handle encodes the information peers exchange out-of-band to (re)initialize the
    communicator via :func:`_reconfigure`.

    Args:
        group (ProcessGroup, optional): The process group to query. If ``None``,
            the default process group is used.
    """
    return _group(group).get_reconfigure_handle()


class ReconfigureOptions:
    """torch's ``ReconfigureOptions``: ``uuid``, ``handles`` (a list fixes the ranks by
    position, a set lets the backend choose), ``timeout`` (None: the group's) and
    ``hints``."""

    def __init__(self) -> None:
        self.uuid = 0
        self.handles: Union[set[str], list[str]] = []
        self.timeout: Optional[timedelta] = None
        self.hints: dict[str, str] = {}


def _reconfigure(uuid: int, handles: Union[set[str], list[str]],
                 group: Optional[ProcessGroup] = None, timeout: Optional[timedelta] = None,
                 hints: Optional[dict[str, str]] = None) -> Work:
    """
    Reconfigure ``group`` with a new set of peers for fault tolerance.

    Args:
        uuid (int): Uniquely identifies this instance of the communicator. Pass
            a fresh value on every (re)initialization.
        handles (set[str] or list[str]): One reconfigure handle per peer, as
            returned by :func:`_get_reconfigure_handle`. A list assigns ranks by
            position; a set lets the backend choose the rank assignment.
        group (ProcessGroup, optional): The process group to reconfigure. If
            ``None``, the default process group is used.
        timeout (timedelta, optional): How long to allow reconfiguration before
            failing. ``None`` uses the backend's default timeout.
        hints (dict[str, str], optional): Backend-specific configuration.

    Returns:
        Work: An async work handle for the reconfigure operation.
    """
    opts = ReconfigureOptions()
    opts.uuid, opts.handles, opts.timeout = uuid, handles, timeout
    opts.hints = dict(hints or {})
    return _group(group).reconfigure(opts)


def _supports_window(group: Optional[ProcessGroup] = None) -> bool:
    """
    Return whether ``group`` supports one-sided (RMA) window operations.

    Args:
        group (ProcessGroup, optional): The process group to query. If ``None``,
            the default process group is used.
    """
    return _group(group).supports_window


def _new_window(tensor: Any = None, group: Optional[ProcessGroup] = None) -> Any:
    """
    Create a new one-sided (RMA) communication window on ``group``.

    This is a collective operation. Every rank in ``group`` must call it in
    the same order. If ``tensor`` is omitted, the subsequent
    ``Window.tensor_register`` call is also collective and must be called by
    every rank in the same order.

    Args:
        tensor (torch.Tensor or numpy.ndarray, optional): If provided, the tensor is
            registered with the new window.
        group (ProcessGroup, optional): The process group to create the window
            on. If ``None``, the default process group is used.

    Returns:
        Window: The new one-sided communication window.
    """
    return _group(group).new_window(tensor)


__all__ = ["ReconfigureOptions", "_get_reconfigure_handle", "_new_window", "_reconfigure",
           "_supports_reconfigure", "_supports_window"]
