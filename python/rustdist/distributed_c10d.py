"""The torch.distributed API over the rustdist engine, with torch's signatures, defaults,
docstrings and argument checks: each function checks what torch checks before it looks at the
group, resolves ``group=`` (:func:`~rustdist._world.api`: a rank outside the group gets torch's
warning and None) and the peers' ranks, and runs the operation's body in ``_ops``. The world
(init, groups, ranks) is ``_world``'s. Tensors are torch CPU or CUDA tensors or numpy arrays,
passed to ``_core`` zero-copy."""

from __future__ import annotations

import inspect
import json
import sys
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional, Union

from . import _core, _debug, _ops
from ._reduce_op import ReduceOp
from ._rendezvous import get_node_local_rank
from ._tensor import _Tensor, routed
from ._torch_backend import ProcessGroup
from ._work import Work
from ._world import (
    _NOT_INITIALIZED,
    SHRINK_ABORT,
    SHRINK_DEFAULT,
    Backend,
    GroupMember,
    _check_timeout,
    _default,
    api,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    peer,
    resolve,
    shrink_group,
    warn_not_member,
)

# torch's private names that programs (and torch's tests) reach as distributed_c10d.<name>
from ._world import _abort_process_group, _get_default_store, _set_pg_timeout  # noqa: F401
from ._fault_tolerance import (  # noqa: F401
    ReconfigureOptions,
    _get_reconfigure_handle,
    _new_window,
    _reconfigure,
    _supports_reconfigure,
    _supports_window,
)


def _tensor_list(xs: Any, name: str) -> None:
    if not isinstance(xs, list):
        raise TypeError(
            f"Invalid function argument. Expected parameter `{name}` of type "
            f"List[torch.Tensor] but got {type(xs)} instead."
        )


def _same_dtypes(*groups: Any) -> None:
    """torch's ``_ensure_all_tensors_same_dtype``, which torch's functions run before their
    other checks: ValueError unless the tensors of ``groups`` (tensors or lists of them) have
    one dtype, a complex tensor counting as its real dtype (torch views it as real)."""
    last, last_name = None, ""
    for x in (x for g in groups for x in (g if isinstance(g, list) else (g,))):
        dtype = getattr(x, "dtype", None)
        if dtype is None:
            continue  # not a tensor: the checks that follow name it
        real = dtype.to_real() if getattr(dtype, "is_complex", False) else dtype
        name = str(real).rpartition(".")[2]  # torch's and numpy's dtypes compare by name
        if last is None:
            last, last_name = real, name
        elif name != last_name:
            raise ValueError(
                f"Invalid usage of tensors with different dtypesFound {last} and  {dtype}"
            )


def _root_list(pg: ProcessGroup, root: int, xs: Optional[list[Any]], name: str,
               role: str) -> list[Any]:
    """The tensor list of gather/scatter: given on the root, absent elsewhere (torch's
    checks), one tensor per rank."""
    if root == pg._rank:
        if not xs:
            raise ValueError(f"Argument ``{name}`` must be specified on {role} rank.")
        if len(xs) != pg._size:
            side = "Input" if name == "scatter_list" else "Output"
            raise RuntimeError(
                f"{name[:-5]}: Incorrect {side.lower()} list size {len(xs)}. {side} list size "
                f"should be {pg._size}, same as size of the process group. (`{name}` needs one "
                "tensor per rank)")
        return xs
    if xs:
        raise ValueError(f"Argument ``{name}`` must NOT be specified on non-{role} ranks.")
    return []


# ---------------------------------------------------------------------------------------------
# Collectives


@api
def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Reduces the tensor data across all machines in a way that all get the final result.

    After the call ``tensor`` is bitwise identical in all processes. In place; complex
    tensors are supported (not with MIN, MAX, PRODUCT or the bitwise ops). Sparse COO tensors
    are summed as with gloo (``ReduceOp.SUM`` only, any nnz per rank): ``tensor`` ends up
    holding the coalesced sum (see ``rustdist._sparse``).

    Args:
        tensor: Input and output of the collective (torch CPU tensor or numpy array).
        op: A ``ReduceOp`` value (rustdist's or torch.distributed's), or a ``PREMUL_SUM``
            made by ``make_premul_sum(factor)``. ``BAND``/``BOR``/``BXOR`` need integer or
            bool tensors, ``AVG`` and ``PREMUL_SUM`` floating point or complex ones.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.all_reduce(group, tensor, op, async_op)


@api
def all_reduce_coalesced(tensors: Any, op: Any = ReduceOp.SUM,
                         group: Optional[ProcessGroup] = None,
                         async_op: bool = False) -> Optional[Work]:
    """Reduces each tensor in ``tensors`` across all machines in such a way that all get the
    final result (deprecated in torch). In place; complex tensors are supported.

    Args:
        tensors: A tensor or a list of tensors of one dtype: input and output.
        op: A ``ReduceOp`` value.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        One async work handle for all the tensors if ``async_op`` is True, else None.
    """
    if not isinstance(tensors, list):
        tensors = [tensors]
    return _ops.all_reduce_coalesced(group, tensors, op, async_op)


@api
def reduce(tensor: Any, dst: Optional[int] = None, op: Any = ReduceOp.SUM,
           group: Optional[ProcessGroup] = None, async_op: bool = False,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Reduces the tensor data across all machines. Only the process with rank ``dst`` is
    going to receive the final result; ``tensor`` is unchanged on the others.

    Args:
        tensor: Input and output of the collective. The function operates in-place.
        dst: Destination rank on global process group (regardless of ``group`` argument).
        op: A ``ReduceOp`` value (see ``all_reduce``).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        group_dst: Destination rank on ``group``. Must specify one of ``group_dst`` and
            ``dst`` but not both.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    root = peer(group, dst, group_dst, "reduce", "root")
    return _ops.reduce(group, tensor, root, op, async_op)


@api
def broadcast(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
              async_op: bool = False, group_src: Optional[int] = None) -> Optional[Work]:
    """Broadcasts the tensor to the whole group.

    ``tensor`` must have the same number of elements in all processes.

    Args:
        tensor: Data to be sent if ``src`` is this rank, else where the received data goes.
        src: Source rank on the global process group (regardless of ``group``).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        group_src: Source rank on ``group``. Give one of ``src`` and ``group_src``.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    root = peer(group, src, group_src, "broadcast", "root")
    return _ops.broadcast(group, tensor, root, async_op)


@api(check=lambda tensor_list, *_: _tensor_list(tensor_list, "tensor_list"))
def all_gather(tensor_list: list[Any], tensor: Any, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Gathers tensors from the whole group in a list.

    Tensors may have different sizes on different ranks: ``tensor_list[r]`` must then have
    the size of rank r's ``tensor``.

    Args:
        tensor_list: Output list of ``world_size`` tensors; ``tensor_list[r]`` receives rank
            r's tensor.
        tensor: Tensor to be broadcast from the current process.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.all_gather(group, tensor_list, tensor, async_op)


@api
def all_gather_coalesced(output_tensor_lists: list[list[Any]], input_tensor_list: list[Any],
                         group: Optional[ProcessGroup] = None,
                         async_op: bool = False) -> Optional[Work]:
    """Gathers input tensors from the whole group in a list in a coalesced manner
    (deprecated in torch): ``output_tensor_lists[r][i]`` receives rank r's
    ``input_tensor_list[i]``. Complex tensors are supported.

    Args:
        output_tensor_lists: ``world_size`` output lists, each with one correctly-sized
            tensor per input tensor.
        input_tensor_list: Tensors to be broadcast from the current process.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        One async work handle for all the tensors if ``async_op`` is True, else None.
    """
    _tensor_list(input_tensor_list, "input_tensor_list")
    _same_dtypes(input_tensor_list)
    if not isinstance(output_tensor_lists, list):
        raise TypeError("Invalid function argument: output_tensor_lists should be a list")
    for out in output_tensor_lists:
        _tensor_list(out, "output_tensor_lists")
        _same_dtypes(out)
    return _ops.all_gather_coalesced(group, output_tensor_lists, input_tensor_list, async_op)


@api
def all_gather_into_tensor(output_tensor: Any, input_tensor: Any,
                           group: Optional[ProcessGroup] = None,
                           async_op: bool = False) -> Optional[Work]:
    """Gather tensors from all ranks and put them in a single output tensor.

    Args:
        output_tensor: Holds ``world_size`` times the input's elements, either as the
            concatenation of the inputs (e.g. flat) or as their stack
            (``(world_size, *input_tensor.shape)``); rank r's block comes r-th.
        input_tensor: Tensor to be gathered from the current rank; same size on every rank.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.all_gather_into_tensor(group, output_tensor, input_tensor, async_op)


@api
def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Optional[ProcessGroup] = None,
                          async_op: bool = False) -> Optional[Work]:
    """Reduces, then scatters a tensor to all ranks in a group.

    Args:
        output: Output tensor, the same size on every rank.
        input: ``world_size`` times the output's elements, as the concatenation of the
            blocks (e.g. flat) or as their stack; rank r gets the reduction of block r.
        op: A ``ReduceOp`` value (see ``all_reduce``).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.reduce_scatter_tensor(group, output, input, op, async_op)


@api(check=lambda output, input_list, *_: _tensor_list(input_list, "input_list"))
def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM,
                   group: Optional[ProcessGroup] = None,
                   async_op: bool = False) -> Optional[Work]:
    """Reduces, then scatters a list of tensors to all processes in a group.

    Args:
        output: Output tensor.
        input_list: List of ``world_size`` tensors, each of the output's size; rank r gets
            the reduction of every rank's ``input_list[r]``.
        op: A ``ReduceOp`` value (see ``all_reduce``).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.reduce_scatter(group, output, input_list, op, async_op)


all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


def _check_rooted(tensor: Any, xs: Optional[list[Any]], name: str) -> None:
    """gather's and scatter's checks before the group: torch's."""
    if xs:
        _tensor_list(xs, name)
    _same_dtypes(tensor, xs or [])


@api(check=lambda tensor, gather_list=None, *_: _check_rooted(tensor, gather_list, "gather_list"))
def gather(tensor: Any, gather_list: Optional[list[Any]] = None, dst: Optional[int] = None,
           group: Optional[ProcessGroup] = None, async_op: bool = False,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Gathers a list of tensors in a single process.

    Args:
        tensor: Input tensor, the same size on every rank.
        gather_list: List of ``world_size`` appropriately-sized tensors to use for gathered
            data; required on the destination rank only, None elsewhere.
        dst: Destination rank on global process group (regardless of ``group`` argument).
            (If both ``dst`` and ``group_dst`` are None, default is global rank 0.)
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        group_dst: Destination rank on ``group``. Invalid to specify both.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    if dst is None and group_dst is None:
        dst = 0
    root = peer(group, dst, group_dst, "gather", "root")
    xs = _root_list(group, root, gather_list, "gather_list", "destination")
    return _ops.gather(group, tensor, xs, root, async_op)


@api(check=lambda tensor, scatter_list=None, *_: _check_rooted(tensor, scatter_list,
                                                               "scatter_list"))
def scatter(tensor: Any, scatter_list: Optional[list[Any]] = None, src: Optional[int] = None,
            group: Optional[ProcessGroup] = None, async_op: bool = False,
            group_src: Optional[int] = None) -> Optional[Work]:
    """Scatters a list of tensors to all processes in a group: rank r's ``tensor`` receives
    the source's ``scatter_list[r]``.

    Args:
        tensor: Output tensor.
        scatter_list: List of ``world_size`` tensors to scatter, each of the output's size;
            required on the source rank only, None elsewhere.
        src: Source rank on global process group (regardless of ``group`` argument).
            (If both ``src`` and ``group_src`` are None, default is global rank 0.)
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    if src is None and group_src is None:
        src = 0
    root = peer(group, src, group_src, "scatter", "root")
    xs = _root_list(group, root, scatter_list, "scatter_list", "source")
    return _ops.scatter(group, tensor, xs, root, async_op)


@api
def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any],
               group: Optional[ProcessGroup] = None, async_op: bool = False) -> Optional[Work]:
    """Scatters a list of input tensors to all processes in a group and returns the gathered
    list of tensors in the output list: rank r's ``output_tensor_list[s]`` receives rank s's
    ``input_tensor_list[r]``. Sizes may differ between pairs of ranks.

    Args:
        output_tensor_list: List of ``world_size`` tensors to be gathered, one per rank.
        input_tensor_list: List of ``world_size`` tensors to scatter, one per rank.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    _tensor_list(output_tensor_list, "output_tensor_list")
    _tensor_list(input_tensor_list, "input_tensor_list")
    return _ops.all_to_all(group, output_tensor_list, input_tensor_list, async_op)


@api
def all_to_all_single(output: Any, input: Any,  # noqa: A002
                      output_split_sizes: Optional[list[int]] = None,
                      input_split_sizes: Optional[list[int]] = None,
                      group: Optional[ProcessGroup] = None,
                      async_op: bool = False) -> Optional[Work]:
    """Split input tensor and then scatter the split list to all processes in a group. Later
    the received tensors are concatenated from all the processes in the group and returned
    as a single output tensor.

    Args:
        output: Gathered concatenated output tensor.
        input: Input tensor to scatter.
        output_split_sizes: Output split sizes along dim 0; None or empty means equal splits
            (``output.size(0)`` must then be divisible by ``world_size``).
        input_split_sizes: Input split sizes along dim 0; None or empty means equal splits.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.all_to_all_single(group, output, input, output_split_sizes, input_split_sizes,
                                  async_op)


@api
def barrier(group: Optional[ProcessGroup] = None, async_op: bool = False,
            device_ids: Optional[list[int]] = None,
            timeout: Optional[timedelta] = None) -> Optional[Work]:
    """Synchronize all processes.

    Blocks until the whole group enters this function (or, with ``async_op``, until the
    returned handle's ``wait()``).

    Args:
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        device_ids: Accepted and ignored (accelerator ids; rustdist runs on the CPU).
        timeout: Timeout for the barrier (default: the group's timeout).

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    return _ops.barrier(group, async_op, timeout)


@api
def monitored_barrier(group: Optional[ProcessGroup] = None,
                      timeout: Optional[Union[timedelta, float]] = None,
                      wait_all_ranks: bool = False) -> None:
    """Synchronize processes similar to ``barrier``, but consider a configurable timeout.

    Rank 0 waits for every other rank to reach the barrier within ``timeout`` and raises
    ``DistBackendError`` naming the first rank that did not (every such rank with
    ``wait_all_ranks=True``): ``[Rank 0]: Rank 2 failed to pass monitoredBarrier in 300 ms (Rank 0
    timed out in monitoredBarrier after 300 ms. Successfully processed ranks: 1)``.
    The other ranks raise when rank 0 reports a failure. The group stays usable.

    Args:
        group: The process group to work on (default: the default group).
        timeout: Timeout for the barrier (a timedelta; float seconds are converted with a
            warning). Default: 30 minutes.
        wait_all_ranks: Whether to collect all failed ranks or raise on the first one.
    """
    if timeout is None:
        timeout = default_pg_timeout
    elif isinstance(timeout, float):
        warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=3,
        )
        timeout = timedelta(seconds=timeout)
    _ops.monitored_barrier(group, _check_timeout(timeout), wait_all_ranks)


# ---------------------------------------------------------------------------------------------
# Point-to-point


@api
def isend(tensor: Any, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_dst: Optional[int] = None) -> Optional[Work]:
    """Send a tensor asynchronously; do not modify it before the request completes. A send
    to this process's own rank is matched by a receive from itself.

    Args:
        tensor: Tensor to send.
        dst: Destination rank on the global process group (regardless of ``group``).
        group: The process group to work on (default: the default group).
        tag: Tag to match send with remote recv.
        group_dst: Destination rank on ``group``. Invalid to specify both.

    Returns:
        A distributed request object; None if not part of the group.
    """
    return _ops.isend(group, tensor, peer(group, dst, group_dst, "isend", "destination"), tag)


@api
def irecv(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_src: Optional[int] = None) -> Optional[Work]:
    """Receives a tensor asynchronously.

    Args:
        tensor: Tensor to fill with received data.
        src: Source rank on the global process group; from any process if unspecified
            (the request's ``source_rank()`` then tells which, as a group rank).
        group: The process group to work on (default: the default group).
        tag: Tag to match recv with remote send.
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        A distributed request object; None if not part of the group.
    """
    src_rank = None
    if src is not None or group_src is not None:
        src_rank = peer(group, src, group_src, "irecv", "source")
    return _ops.irecv(group, tensor, src_rank, tag)


@api
def send(tensor: Any, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
         tag: int = 0, group_dst: Optional[int] = None) -> None:
    """Send a tensor synchronously.

    Args:
        tensor: Tensor to send.
        dst: Destination rank on the global process group (regardless of ``group``); not
            this process's rank.
        group: The process group to work on (default: the default group).
        tag: Tag to match send with remote recv.
        group_dst: Destination rank on ``group``. Invalid to specify both.
    """
    dst_rank = peer(group, dst, group_dst, "send", "destination")
    if dst_rank == group._rank:  # torch forbids a blocking send to self
        raise ValueError(
            "Invalid destination rank: destination rank should not be the same as "
            "the rank of the current process."
        )
    _ops.isend(group, tensor, dst_rank, tag).wait()


_SELF_SOURCE = ("Invalid source rank: source rank should not be the same as the rank of the "
                "current process.")


@api(non_member=-1)
def recv(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
         tag: int = 0, group_src: Optional[int] = None) -> int:
    """Receives a tensor synchronously.

    Args:
        tensor: Tensor to fill with received data.
        src: Source rank on the global process group; from any process if unspecified.
        group: The process group to work on (default: the default group).
        tag: Tag to match recv with remote send.
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        Sender rank (global); -1 if not part of the group.
    """
    src_rank = None
    if src is not None or group_src is not None:
        src_rank = peer(group, src, group_src, "recv", "source")
    work = _ops.irecv(group, tensor, src_rank, tag)
    work.wait()
    if src is not None:
        return src
    if group_src is None:
        group_src = _ops.sender(work)
        if group_src == group._rank:
            raise ValueError(_SELF_SOURCE)
    return group._global_rank(group_src)


class P2POp:
    """A class to build point-to-point operations for ``batch_isend_irecv``.

    This class builds the type of P2P operation, communication buffer, peer rank, Process
    Group, and tag.

    Args:
        op: ``isend`` or ``irecv`` (rustdist's or torch.distributed's).
        tensor: Tensor to send or receive.
        peer: Destination or source rank (global).
        group: The process group to work on (default: the default group).
        tag: Tag to match send with recv.
        group_peer: Destination or source rank on ``group``. Invalid to specify both.
    """

    def __new__(cls, op: Callable[..., Any], tensor: Any, peer: Optional[int] = None,
                group: Optional[ProcessGroup] = None, tag: int = 0,
                group_peer: Optional[int] = None) -> P2POp:
        if _p2p_kind(op) is None:
            raise ValueError(
                "Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                "``torch.distributed.irecv``."
            )
        routed(tensor, "tensor")  # a CUDA tensor is checked where its batch runs
        return object.__new__(cls)

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: Optional[int] = None,
                 group: Optional[ProcessGroup] = None, tag: int = 0,
                 group_peer: Optional[int] = None) -> None:
        self.op = op
        self.tensor = tensor
        pg = _default() if group is None else group
        if pg is None:
            raise ValueError(_NOT_INITIALIZED)
        self.group: Any = pg
        if group_peer is not None:
            if peer is not None:
                raise ValueError("Can't specify both group_rank and global_rank")
            self.peer = get_global_rank(pg, group_peer)
            self.group_peer = group_peer
        else:
            if peer is None:
                raise ValueError("Must specify global_rank or group_rank")
            self.peer = peer
            self.group_peer = get_group_rank(pg, peer)
        self.tag = tag

    def __repr__(self) -> str:
        me = get_rank(self.group)
        kind = _p2p_kind(self.op)
        s, d = (me, self.group_peer) if kind == "send" else (self.group_peer, me)
        name = getattr(self.group, "group_name", "default_pg")
        return (f"P2POp({self.op.__name__} pg={name}, group_src={s}, group_dst={d},  "
                f"{tuple(self.tensor.shape)}, {self.tensor.dtype})")


def _p2p_kind(op: Any) -> Optional[str]:
    """"send" for isend, "recv" for irecv (rustdist's or torch's), else None."""
    if op is isend:
        return "send"
    if op is irecv:
        return "recv"
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is not None:
        if op is torch_dist.isend:
            return "send"
        if op is torch_dist.irecv:
            return "recv"
    return None


@_debug.exception_logger
def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Send or Receive a batch of tensors asynchronously and return a list of requests.

    All operations are posted in order without waiting, so the relative ordering of sends
    and receives to different peers does not matter and cannot deadlock; operations between
    the same pair of ranks in the same direction match in order.

    Args:
        p2p_op_list: A list of point-to-point operations (``P2POp``), all on one group.

    Returns:
        A list of distributed request objects, one per operation (none on non-members).
    """
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError(
            "Invalid ``p2p_op_list``. Each op is expected to to be of type "
            "``torch.distributed.P2POp``."
        )
    grp = p2p_op_list[0].group
    if not all(grp == p.group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    kinds = [_p2p_kind(p.op) for p in p2p_op_list]
    pg = resolve(grp)
    if pg is None:
        for kind in kinds:
            warn_not_member(f"i{kind}")
        return []
    ops = [(kind == "send",
            p.tensor,
            peer(pg, None, p.group_peer, f"i{kind}", "destination" if kind == "send" else "source"),
            p.tag)
           for kind, p in zip(kinds, p2p_op_list)]
    return _ops.batch_isend_irecv(pg, ops)


def stats(group: Optional[ProcessGroup] = None) -> dict[str, Any]:
    """rustdist's counters of ``group`` (None: the default group) on this rank, since it was
    made: ``ops``, by operation name (torch's, as the flight recorder names them), each with
    ``count`` and ``bytes`` (of its inputs; a receive's, of its buffer); ``algorithms``, by
    ``"collective/algorithm"`` (as ``RUSTDIST_ALGO`` names them), the collectives that ran
    each; ``waited_s``, the seconds the group's transport slept waiting for peers. Not a
    torch.distributed function: rustdist's own, as is ``python -m rustdist.status``, which
    shows them for every rank (``--metrics`` in the OpenMetrics text format)."""
    pg = _default() if group is None else group
    if pg is None:
        raise ValueError(_NOT_INITIALIZED)
    core = getattr(pg, "_pg", None)
    if core is None:
        raise ValueError(f"{pg} is not a rustdist process group")
    counters: dict[str, Any] = json.loads(core.stats())
    return counters


# ---------------------------------------------------------------------------------------------
# The fast path


def _text_signature(fn: Callable[..., Any]) -> Optional[str]:
    """``fn``'s parameters as CPython writes a builtin's signature (``(a, b=None)``), or None
    when a default is not a literal (inspect reads only literals back from a builtin)."""
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty:
            params.append(p.name)
        elif p.default is None or isinstance(p.default, (bool, int, float, str)):
            params.append(f"{p.name}={p.default!r}")
        else:
            return None
    return f"({', '.join(params)})"


def _install_fast_functions() -> None:
    """The hot collectives' usual calls (a plain contiguous CPU tensor, SUM, a rustdist group,
    ``async_op`` False or True, no DETAIL checks) skip this layer through ``_core.fast_function``, builtins
    that hand every other call to the functions above (``_core.fast_init`` was set up by
    ``_torch_backend``). A builtin carries its function's docstring and signature; where a
    default is not a literal (``op=ReduceOp.SUM``) a function with the same parameters stands
    in front and passes its arguments on by position."""
    fast = {}
    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                 "all_to_all_single", "barrier"):
        python = globals()[name]
        params = _text_signature(python)
        doc = python.__doc__ or ""
        if params is None:
            builtin = _core.fast_function(name, python, __name__, doc)
            fast[name] = _debug.compiled_like(python, "    return fast({call})\n",
                                              {"fast": builtin})
        else:
            fast[name] = _core.fast_function(name, python, __name__,
                                             f"{name}{params}\n--\n\n{doc}")
    fast["all_gather_single"] = fast["all_gather_into_tensor"]
    fast["reduce_scatter_single"] = fast["reduce_scatter_tensor"]
    globals().update(fast)


if _Tensor is not None:  # the fast path reads torch tensors; numpy arrays take the above
    _install_fast_functions()


__all__ = [
    "SHRINK_ABORT", "SHRINK_DEFAULT",
    "Backend", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "Work", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "broadcast", "default_pg_timeout", "destroy_process_group", "gather", "get_backend",
    "get_global_rank", "get_group_rank", "get_node_local_rank", "get_process_group_ranks",
    "get_rank",
    "get_world_size", "group", "init_process_group", "irecv", "is_available", "is_initialized",
    "isend", "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "recv", "reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
    "scatter", "send", "shrink_group", "stats",
]
