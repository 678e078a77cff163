"""Collectives of picklable Python objects (torch.distributed's ``*_object*`` functions).

Objects are pickled into uint8 numpy arrays; their sizes go first (int64), then the bytes,
each rank sending exactly its own size (no padding to the largest object). Numpy keeps this
independent of torch; the ``device`` arguments accept only the CPU.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Optional

import numpy as np

from . import _ops
from . import distributed_c10d as c10d
from ._group import ProcessGroup
from ._world import api, peer

_INT64 = 7  # _core dtype code


def _to_array(obj: Any) -> np.ndarray:
    f = io.BytesIO()
    pickle.Pickler(f).dump(obj)
    return np.frombuffer(f.getbuffer(), dtype=np.uint8)


def _from_array(arr: np.ndarray) -> Any:
    return pickle.Unpickler(io.BytesIO(arr.tobytes())).load()


def _check_device(device: Any) -> None:
    """Objects travel as pickled bytes on the CPU whatever ``device`` says (torch moves them
    to the device for NCCL; rustdist needs not): cpu and cuda are accepted."""
    if device is not None and str(getattr(device, "type", device)).split(":")[0] not in (
            "cpu", "cuda"):
        raise RuntimeError(f"rustdist does not support device {device} for object collectives; "
                           "pass None, 'cpu' or a CUDA device")


def _sizes(arrays: list[np.ndarray]) -> np.ndarray:
    return np.array([a.size for a in arrays], dtype=np.int64)


def _split(flat: np.ndarray, sizes: np.ndarray) -> list[Any]:
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    return [_from_array(flat[bounds[i]:bounds[i + 1]]) for i in range(len(sizes))]


@api
def all_gather_object(object_list: list[Any], obj: Any,
                      group: Optional[ProcessGroup] = None) -> None:
    """Gathers picklable objects from the whole group into a list.

    Similar to ``all_gather``, but Python objects can be passed in. Note that the object must
    be picklable in order to be gathered.

    Args:
        object_list: Output list. It should be correctly sized as the size of the group for
            this collective and will contain the output.
        obj: Input object. Must be picklable.
        group: The process group to work on (default: the default group).

    Returns:
        None. If the calling rank is part of this group, the output of the collective will
        be populated into the input ``object_list``.
    """
    mine = _to_array(obj)
    sizes = np.zeros(group._size, dtype=np.int64)
    c10d.all_gather(list(sizes.reshape(-1, 1)), np.array([mine.size], dtype=np.int64), group)
    outs = [np.empty(int(n), dtype=np.uint8) for n in sizes]
    c10d.all_gather(outs, mine, group)
    for i, out in enumerate(outs):
        object_list[i] = _from_array(out)


@api
def gather_object(obj: Any, object_gather_list: Optional[list[Any]] = None,
                  dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
                  group_dst: Optional[int] = None) -> None:
    """Gathers picklable objects from the whole group in a single process.

    Args:
        obj: Input object. Must be picklable.
        object_gather_list: Output list. On the ``dst`` rank, it should be correctly sized
            as the size of the group for this collective and will contain the output. Must
            be ``None`` on non-dst ranks.
        dst: Destination rank on global process group (regardless of ``group`` argument).
            (If both ``dst`` and ``group_dst`` are None, default is global rank 0.)
        group: The process group to work on (default: the default group).
        group_dst: Destination rank on ``group``. Invalid to specify both.

    Returns:
        None. On the ``dst`` rank, ``object_gather_list`` will contain the output.
    """
    if dst is None and group_dst is None:
        dst = 0
    root = peer(group, dst, group_dst, "gather_object", "root")
    me = group._rank
    if root == me and not object_gather_list:
        raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
    if root != me and object_gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination ranks.")
    mine = _to_array(obj)
    sizes = np.zeros(group._size, dtype=np.int64)
    size_outs = list(sizes.reshape(-1, 1)) if root == me else None
    c10d.gather(np.array([mine.size], dtype=np.int64), size_outs, group=group, group_dst=root)
    outs = [np.empty(int(n), dtype=np.uint8) for n in sizes] if root == me else []
    _ops.gather(group, mine, outs, root, False, sized=False)
    if root == me and object_gather_list is not None:  # not None: checked above
        for i, out in enumerate(outs):
            object_gather_list[i] = _from_array(out)


@api(check=lambda object_list, src=None, group=None, device=None, *_: _check_device(device))
def broadcast_object_list(object_list: list[Any], src: Optional[int] = None,
                          group: Optional[ProcessGroup] = None, device: Any = None,
                          group_src: Optional[int] = None) -> None:
    """Broadcasts picklable objects in ``object_list`` to the whole group.

    Similar to ``broadcast``, but Python objects can be passed in. Note that all objects in
    ``object_list`` must be picklable in order to be broadcasted.

    Args:
        object_list: List of input objects to broadcast. Each object must be picklable. Only
            objects on the ``src`` rank will be broadcast, but each rank must provide lists
            of equal sizes.
        src: Source rank from which to broadcast ``object_list`` (global rank; if both
            ``src`` and ``group_src`` are None, default is global rank 0).
        group: The process group to work on (default: the default group).
        device: None or the CPU: where the serialized bytes live.
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        ``None``. If rank is part of the group, ``object_list`` will contain the broadcasted
        objects from ``src`` rank.
    """
    if src is None and group_src is None:
        src = 0
    root = peer(group, src, group_src, "broadcast_object_list", "root")
    is_root = root == group._rank
    arrays = [_to_array(o) for o in object_list] if is_root else []
    sizes = _sizes(arrays) if is_root else np.empty(len(object_list), dtype=np.int64)
    c10d.broadcast(sizes, group=group, group_src=root)
    if is_root:
        flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint8)
    else:
        flat = np.empty(int(sizes.sum()), dtype=np.uint8)
    c10d.broadcast(flat, group=group, group_src=root)
    if not is_root:
        object_list[:] = _split(flat, sizes)


@api
def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: Optional[list[Any]] = None,
                        src: Optional[int] = None, group: Optional[ProcessGroup] = None,
                        group_src: Optional[int] = None) -> None:
    """Scatters picklable objects in ``scatter_object_input_list`` to the whole group.

    Similar to ``scatter``, but Python objects can be passed in. On each rank, the scattered
    object will be stored as the first element of ``scatter_object_output_list``.

    Args:
        scatter_object_output_list: Non-empty list whose first element will store the object
            scattered to this rank.
        scatter_object_input_list: List of input objects to scatter (one per rank); only
            used on the ``src`` rank.
        src: Source rank from which to scatter (global; if both ``src`` and ``group_src``
            are None, default is global rank 0).
        group: The process group to work on (default: the default group).
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        ``None``. If rank is part of the group, ``scatter_object_output_list`` will have its
        first element set to the scattered object for this rank.
    """
    if src is None and group_src is None:
        src = 0
    root = peer(group, src, group_src, "scatter_object_list", "root")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError(
            "Expected argument scatter_object_output_list to be a list of size at least 1."
        )
    is_root = root == group._rank
    if is_root:
        if scatter_object_input_list is None:
            raise ValueError("source rank must provide non-None scatter_object_input_list")
        arrays = [_to_array(o) for o in scatter_object_input_list]
        size_ins = list(_sizes(arrays).reshape(-1, 1))
    else:
        arrays, size_ins = [], None
    size = np.zeros(1, dtype=np.int64)
    c10d.scatter(size, size_ins, group=group, group_src=root)
    out = np.empty(int(size[0]), dtype=np.uint8)
    _ops.scatter(group, out, arrays, root, False, sized=False)
    scatter_object_output_list[0] = _from_array(out)


@api(check=lambda object_list, dst=None, group=None, device=None, *_: _check_device(device))
def send_object_list(object_list: list[Any], dst: Optional[int] = None,
                     group: Optional[ProcessGroup] = None, device: Any = None,
                     group_dst: Optional[int] = None, use_batch: bool = False) -> None:
    """Sends picklable objects in ``object_list`` synchronously.

    Similar to ``send``, but Python objects can be passed in. Note that all objects in
    ``object_list`` must be picklable in order to be sent.

    Args:
        object_list: List of input objects to send. Each object must be picklable. Receiver
            must provide lists of equal sizes.
        dst: Destination rank to send ``object_list`` to (global rank).
        group: The process group to work on (default: the default group).
        device: None or the CPU.
        group_dst: Destination rank on ``group``. Must specify one of ``dst`` and
            ``group_dst`` but not both.
        use_batch: Accepted for torch compatibility (sends are posted the same way).
    """
    dst_rank = peer(group, dst, group_dst, "send_object_list", "destination")
    if dst_rank == group._rank:
        raise ValueError("Invalid destination rank: destination rank should not be the same "
                         "as the rank of the current process.")
    arrays = [_to_array(o) for o in object_list]
    c10d.send(_sizes(arrays), group=group, group_dst=dst_rank)
    c10d.send(np.concatenate(arrays) if arrays else np.empty(0, dtype=np.uint8), group=group,
              group_dst=dst_rank)


@api(check=lambda object_list, src=None, group=None, device=None, *_: _check_device(device),
     non_member=-1)
def recv_object_list(object_list: list[Any], src: Optional[int] = None,
                     group: Optional[ProcessGroup] = None, device: Any = None,
                     group_src: Optional[int] = None, use_batch: bool = False) -> int:
    """Receives picklable objects in ``object_list`` synchronously.

    Similar to ``recv``, but can receive Python objects.

    Args:
        object_list: List of objects to receive into. Must provide a list of sizes equal to
            the size of the list being sent.
        src: Source rank from which to recv ``object_list`` (global rank); from any rank if
            both ``src`` and ``group_src`` are None.
        group: The process group to work on (default: the default group).
        device: None or the CPU.
        group_src: Source rank on ``group``. Invalid to specify both.
        use_batch: Accepted for torch compatibility.

    Returns:
        Sender rank (global). -1 if rank is not part of the group.
    """
    if src is not None or group_src is not None:
        group_src = peer(group, src, group_src, "recv_object_list", "source")
        if group_src == group._rank:
            raise ValueError(c10d._SELF_SOURCE)
    sizes = np.empty(len(object_list), dtype=np.int64)
    sender = c10d.recv(sizes, group=group, group_src=group_src)
    flat = np.empty(int(sizes.sum()), dtype=np.uint8)
    # the payload comes from whoever sent the sizes
    c10d.recv(flat, group=group, group_src=group._group_rank(sender))
    object_list[:] = _split(flat, sizes)
    return sender


__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "recv_object_list",
           "scatter_object_list", "send_object_list"]
