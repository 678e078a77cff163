"""rustdist as a ``torch.distributed`` backend.

:class:`GroupBase` is the base class of ``rustdist.ProcessGroup``: with torch importable it
is a ``torch.distributed.ProcessGroup`` subclass whose methods (the ones torch's Python API
and its C++ code call on a backend: ``allreduce``, ``allgather``, ``broadcast``, ...) run on
rustdist's engine through rustdist's own API functions. So one group object serves both
``import rustdist as dist`` and ``torch.distributed`` with backend ``"rustdist"``.

:func:`register` registers the backend with ``torch.distributed.Backend.register_backend``
(idempotent, devices cpu and cuda); ``init_process_group("rustdist")`` and
``"cpu:rustdist,cuda:rustdist"`` then send CPU and CUDA tensors through rustdist.

Subclasses must provide ``_pg`` (the ``_core.ProcessGroup``) and ``group_name`` (the engine
group's name, which :func:`_create` sets to torch's group name).
"""

import functools
import sys
from datetime import timedelta
from typing import Any, Callable, List, Optional, TypeVar

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch
    import torch.distributed as _td
except ImportError:
    torch = None  # type: ignore[assignment]
    _td = None  # type: ignore[assignment]

BACKEND_NAME = "rustdist"

_F = TypeVar("_F", bound=Callable[..., Any])


def _not_traced(fn: _F) -> _F:
    """``torch.compiler.disable`` applied lazily: C++ calls these methods from compiled code,
    and dynamo must not trace them. Until ``torch._dynamo`` is imported nothing can be
    compiling, so importing rustdist does not pay dynamo's import time."""
    disabled: Optional[Callable[..., Any]] = None

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None:
                return fn(*args, **kwargs)
            dynamo.eval_frame.skip_code(method.__code__)
            disabled = torch.compiler.disable(fn, recursive=True)
        return disabled(*args, **kwargs)

    return method  # type: ignore[return-value]


_api_module: Any = None


def _api() -> Any:
    """rustdist's torch.distributed-compatible API (imported on first use: it imports this
    module)."""
    global _api_module
    if _api_module is None:
        from . import distributed_c10d

        _api_module = distributed_c10d
    return _api_module


def _op(opts: Any) -> Any:
    """The ReduceOp of torch's options object (or a bare ReduceOp, as Python callers pass)."""
    return getattr(opts, "reduceOp", opts)


def _root(opts: Any) -> int:
    return opts.rootRank


def _async(opts: Any) -> bool:
    """Whether the caller may overlap the operation: torch's Python API says so in
    ``asyncOp``. False: it would wait at once, so the operation runs right away on the calling
    thread and the method returns None, which torch reads as "the backend has synchronised";
    C++ callers (DDP, functional collectives) leave the default, True."""
    return getattr(opts, "asyncOp", True)


# The argument checks of torch's gloo backend (ProcessGroupGloo), which torch's tests assert
# on the backend object: RuntimeError with gloo's text after the method's name. The methods
# below make them before anything runs, so every rank that makes the same bad call raises.


def _invalid(op: str, what: str) -> RuntimeError:
    """The error of method ``op`` for an invalid argument, ``what`` in gloo's words."""
    return RuntimeError(f"{op}: {what}")


def _layout_error(op: str, i: int, expected: Any, got: Any) -> RuntimeError:
    """gloo's error for tensor ``i`` of layout ``got`` among tensors of layout ``expected``; a
    NotImplementedError (``_sparse.SparseInput``) when one is sparse, as torch's dispatcher
    refuses sparse tensors for these ops before gloo sees them."""
    error = _invalid(op, f"invalid tensor layout at index {i} (expected {expected}, got {got})")
    if torch is not None and torch.sparse_coo in (expected, got):
        from ._sparse import SparseInput

        return SparseInput(str(error))
    return error


def _check_root(op: str, root: int, size: int, root_tensor: int, count: int) -> None:
    """The root rank is a group rank, and the root tensor an index of the ``count`` tensors."""
    if not 0 <= root < size:
        raise _invalid(op, f"invalid root rank: {root}")
    if not 0 <= root_tensor < count:
        raise _invalid(op, f"invalid root tensor: {root_tensor}")


def _check_alike(op: str, tensors: Any, first: Any, sizes: bool = True) -> None:
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


def _check_allreduce(tensors: Any) -> None:
    """``allreduce``: a non-empty list of tensors alike (one tensor is the usual call)."""
    if len(tensors) != 1:
        if not tensors:
            raise _invalid("allreduce", "requires non-empty tensor list")
        _check_alike("allreduce", tensors, tensors[0])


def _check_allreduce_coalesced(tensors: Any) -> None:
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
        from ._sparse import unsupported

        error = unsupported("tensors", "all_reduce_coalesced")
        raise type(error)(f"{op}: unsupported layout: {error}")


def _check_reduce(tensors: Any, opts: Any, size: int) -> None:
    """``reduce``: a root in the group and one tensor."""
    _check_root("reduce", opts.rootRank, size, getattr(opts, "rootTensor", 0), len(tensors))
    if len(tensors) != 1:
        raise _invalid("reduce", "requires a single-element tensor list")


def _check_allgather(outputs: Any, inputs: Any, size: int) -> None:
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
    _check_alike(op, inputs, inputs[0])
    for out in outputs:
        _check_alike(op, out, inputs[0], sizes=False)


def _check_rooted(op: str, opts: Any, rank: int, size: int, singles: Any, lists: Any) -> None:
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
    _check_alike(op, lists[0], singles[0])


if torch is None:

    class GroupBase:
        """Base class of ``rustdist.ProcessGroup`` (torch is not installed)."""

        def __init__(self, rank: int, size: int) -> None:
            """Nothing to set up without torch; the arguments mirror torch's constructor."""

    def register() -> None:
        """Registers nothing: torch is not installed."""

else:
    from torch import Tensor

    from . import _torch_private as _private

    @torch.jit.ignore
    def _outputs_or_raise(done: List[Tensor], outputs: List[Tensor]) -> List[Tensor]:
        """``outputs``; raises the first error among ``done``, the collect_all futures (typed
        as tensors for TorchScript, which converts neither argument)."""
        for fut in done:
            fut.value()  # raises the operation's error
        return outputs

    @torch.jit.script
    def _await_outputs(
        fut: torch.futures.Future[List[Tensor]], outputs: List[Tensor]
    ) -> List[Tensor]:
        return _outputs_or_raise(torch.jit.wait(fut), outputs)

    @torch.jit.script
    def _typed_future(
        fut: torch.futures.Future[List[Tensor]], outputs: List[Tensor]
    ) -> torch.futures.Future[List[Tensor]]:
        # A future made in Python holds a Python object, but DDP's C++ comm hooks
        # (fp16/bf16 compress) assert `result.isTensorList()`. A TorchScript fork returns a
        # future typed List[Tensor]; its task suspends in wait() (no thread held) and the
        # ignored Python call converts the value on completion. (No `from __future__ import
        # annotations` in this module: TorchScript cannot resolve string annotations here.)
        return torch.jit.fork(_await_outputs, fut, outputs)

    class RustdistWork(_private.WorkBase):
        """A ``torch.distributed.Work`` over a rustdist Work (one op, or coalesced ones
        combined by rustdist)."""

        def __init__(self, work: Any, outputs: list[Tensor]) -> None:
            super().__init__()
            self._rd = work
            self._outputs = outputs
            self._future: Any = None

        @_not_traced
        def wait(self, timeout: timedelta = timedelta(0)) -> bool:
            """Blocks (GIL released in the engine) until done; raises the op's error, or
            DistBackendError once ``timeout`` passes (zero: the group's timeout)."""
            return self._rd.wait(timeout)

        def is_completed(self) -> bool:
            """Whether the operation has finished (successfully or not); non-blocking."""
            return self._rd.is_completed()

        def is_success(self) -> bool:
            """Whether the operation has finished successfully."""
            return self._rd.is_success()

        def exception(self) -> Optional[BaseException]:
            """The operation's error, or None."""
            return self._rd.exception()

        def result(self) -> list[Tensor]:
            """The output tensors of the operation."""
            return list(self._outputs)

        def _source_rank(self) -> int:
            """The sender's group rank, for a completed receive from any source."""
            return self._rd.source_rank()

        source_rank = _source_rank

        @_not_traced
        def get_future(self) -> torch.futures.Future:
            """A future completed (by the engine) with the list of output tensors, typed
            List[Tensor] so that C++ consumers (DDP's built-in comm hooks) can read it."""
            if self._future is None:
                done = torch.futures.collect_all([self._rd.get_future()])
                self._future = _typed_future(done, self._outputs)
            return self._future

    class GroupBase(_td.ProcessGroup):
        """A ``torch.distributed.ProcessGroup`` whose collectives run on rustdist's engine.

        torch's Python API and C++ (DDP, functional collectives, DTensor, FSDP2) call the
        methods below with group ranks and torch's option objects; each hands the call to
        rustdist's API on ``self`` and returns a :class:`RustdistWork`.
        """

        def __init__(self, rank: int, size: int) -> None:
            # torch's (store, rank, size) constructor fails for Python subclasses.
            super().__init__(rank, size)
            self._td_name: Optional[str] = None
            self._td_desc = ""

        def _work(self, works: list[Any], outputs: list[Tensor]) -> RustdistWork:
            """The Work torch gets for rustdist Works ``works`` (one op, or coalesced ones)."""
            if len(works) == 1:
                combined = works[0]
            else:
                from . import _core

                combined = _api().Work(_core.join([w._work for w in works]), outputs)
            work = RustdistWork(combined, outputs)
            _private.keep_for_functional_collectives(work, outputs)
            _private.register_inflight_outputs(work, outputs)
            return work

        # -- identity ---------------------------------------------------------------------

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            """The backend's name, ``"rustdist"``."""
            return BACKEND_NAME

        def getGroupName(self) -> str:  # noqa: N802
            """The name torch registered the group under (the engine group's name before)."""
            return self._td_name if self._td_name is not None else self._pg.group_name

        def setGroupName(self, name: str) -> None:  # noqa: N802
            """Called by torch when it registers the group."""
            self._td_name = name

        def getGroupDesc(self) -> str:  # noqa: N802
            """The group's description (torch's ``group_desc``)."""
            return self._td_desc

        def setGroupDesc(self, desc: str) -> None:  # noqa: N802
            """Called by torch when it registers the group."""
            self._td_desc = desc

        def _get_backend(self, device: Any) -> "GroupBase":
            """The backend serving ``device``: this group, for every device."""
            return self

        @property
        def supports_splitting(self) -> bool:
            """``split_group`` is not supported (it needs an accelerator in torch too)."""
            return False

        @property
        def supports_coalescing(self) -> bool:
            """Coalesced ops go through the ``*_coalesced`` methods, not start/end."""
            return False

        @_not_traced
        def shutdown(self) -> None:
            """Leaves the group cleanly (``destroy_process_group`` calls this)."""
            self._shutdown()

        # -- collectives ------------------------------------------------------------------

        @_not_traced
        def allreduce(self, tensors: list[Tensor], opts: Any = None) -> Optional[RustdistWork]:
            """all_reduce of each tensor (torch's AllreduceOptions give the op)."""
            op = _op(opts) if opts is not None else _td.ReduceOp.SUM
            if isinstance(tensors, Tensor):
                tensors = [tensors]
            _check_allreduce(tensors)
            api = _api()
            if len(tensors) != 1:  # one call, so that a tensor listed twice is reduced once
                return self.allreduce_coalesced(tensors, opts)
            if not _async(opts):
                api.all_reduce(tensors[0], op=op, group=self)
                return None
            return self._work([api.all_reduce(tensors[0], op=op, group=self, async_op=True)],
                              list(tensors))

        @_not_traced
        def allreduce_coalesced(self, tensors: list[Tensor],
                                opts: Any = None) -> Optional[RustdistWork]:
            """all_reduce_coalesced of the list as one call: a tensor listed twice is reduced
            once. Sparse tensors are refused, as gloo refuses them (only all_reduce sums
            them)."""
            op = _op(opts) if opts is not None else _td.ReduceOp.SUM
            tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
            _check_allreduce_coalesced(tensors)
            api = _api()
            if not _async(opts):
                api.all_reduce_coalesced(tensors, op=op, group=self)
                return None
            work = api.all_reduce_coalesced(tensors, op=op, group=self, async_op=True)
            return self._work([work], tensors)

        @_not_traced
        def broadcast(self, tensors: list[Tensor], opts: Any) -> Optional[RustdistWork]:
            """broadcast from group rank ``opts.rootRank``."""
            if isinstance(tensors, Tensor):
                tensors = [tensors]
            api = _api()
            root = _root(opts)
            _check_root("broadcast", root, self.size(), getattr(opts, "rootTensor", 0),
                        len(tensors))
            _check_alike("broadcast", tensors, tensors[0])
            if not _async(opts):
                for t in tensors:
                    api.broadcast(t, group=self, group_src=root)
                return None
            works = [api.broadcast(t, group=self, async_op=True, group_src=root) for t in tensors]
            return self._work(works, list(tensors))

        @_not_traced
        def reduce(self, tensors: list[Tensor], opts: Any) -> RustdistWork:
            """reduce to group rank ``opts.rootRank``."""
            _check_reduce(tensors, opts, self.size())
            api = _api()
            t = tensors[0]
            work = api.reduce(t, op=_op(opts), group=self, async_op=True, group_dst=_root(opts))
            return self._work([work], [t])

        @_not_traced
        def allgather(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                      opts: Any = None) -> RustdistWork:
            """all_gather of ``inputs[0]`` into ``output_lists[0]``."""
            _check_allgather(output_lists, inputs, self.size())
            api = _api()
            out = output_lists[0]
            work = api.all_gather(out, inputs[0], group=self, async_op=True)
            return self._work([work], list(out))

        @_not_traced
        def allgather_coalesced(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                                opts: Any = None) -> RustdistWork:
            """all_gather_coalesced: ``output_lists`` laid out as torch's Python API has it."""
            work = _api().all_gather_coalesced(output_lists, inputs, group=self, async_op=True)
            return self._work([work], [t for o in output_lists for t in o])

        @_not_traced
        def _allgather_base(self, output: Tensor, input: Tensor,  # noqa: A002
                            opts: Any = None) -> Optional[RustdistWork]:
            """all_gather_into_tensor: ``output`` holds every rank's ``input`` in rank order."""
            if not _async(opts):
                _api().all_gather_into_tensor(output, input, group=self)
                return None
            work = _api().all_gather_into_tensor(output, input, group=self, async_op=True)
            return self._work([work], [output])

        all_gather_single = _allgather_base

        @_not_traced
        def allgather_into_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                            opts: Any = None) -> RustdistWork:
            """all_gather_into_tensor of each input/output pair."""
            work = _api()._pairs_coalesced("all_gather_into_tensor", outputs, inputs,
                                           group=self)
            return self._work([work], list(outputs))

        all_gather_single_coalesced = allgather_into_tensor_coalesced

        @_not_traced
        def reduce_scatter(self, outputs: list[Tensor], input_lists: list[list[Tensor]],
                           opts: Any = None) -> RustdistWork:
            """reduce_scatter: ``outputs[0]`` gets the reduction of every rank's
            ``input_lists[0][rank]``. Runs as reduce_scatter_tensor over the stacked list."""
            out = outputs[0]
            stacked = torch.stack([t.reshape(out.shape) for t in input_lists[0]])
            op = _op(opts) if opts is not None else _td.ReduceOp.SUM
            work = _api().reduce_scatter_tensor(out, stacked, op=op, group=self, async_op=True)
            return self._work([work], [out])

        @_not_traced
        def _reduce_scatter_base(self, output: Tensor, input: Tensor,  # noqa: A002
                                 opts: Any = None) -> Optional[RustdistWork]:
            """reduce_scatter_tensor: rank r gets the reduction of block r of ``input``."""
            op = _op(opts) if opts is not None else _td.ReduceOp.SUM
            if not _async(opts):
                _api().reduce_scatter_tensor(output, input, op=op, group=self)
                return None
            work = _api().reduce_scatter_tensor(output, input, op=op, group=self, async_op=True)
            return self._work([work], [output])

        reduce_scatter_single = _reduce_scatter_base

        @_not_traced
        def reduce_scatter_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                            opts: Any = None) -> RustdistWork:
            """reduce_scatter_tensor of each input/output pair."""
            op = _op(opts) if opts is not None else _td.ReduceOp.SUM
            work = _api()._pairs_coalesced("reduce_scatter_tensor", outputs, inputs, op=op,
                                           group=self)
            return self._work([work], list(outputs))

        reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

        @_not_traced
        def all_to_all_single(self, output: Tensor, input: Tensor,  # noqa: A002
                              output_split_sizes: list[int], input_split_sizes: list[int],
                              opts: Any = None) -> RustdistWork:
            """all_to_all_single; empty split lists mean equal splits."""
            work = _api().all_to_all_single(output, input, output_split_sizes or None,
                                            input_split_sizes or None, group=self,
                                            async_op=True)
            return self._work([work], [output])

        alltoall_base = all_to_all_single

        @_not_traced
        def alltoall(self, outputs: list[Tensor], inputs: list[Tensor],
                     opts: Any = None) -> RustdistWork:
            """all_to_all: ``outputs[r]`` receives rank r's ``inputs[rank]``."""
            work = _api().all_to_all(outputs, inputs, group=self, async_op=True)
            return self._work([work], list(outputs))

        @_not_traced
        def gather(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                   opts: Any) -> RustdistWork:
            """gather to group rank ``opts.rootRank`` (``output_lists`` is empty elsewhere)."""
            _check_rooted("gather", opts, self.rank(), self.size(), inputs, output_lists)
            gather_list = output_lists[0] if output_lists else None
            work = _api().gather(inputs[0], gather_list, group=self, async_op=True,
                                 group_dst=_root(opts))
            return self._work([work], list(gather_list or []))

        @_not_traced
        def scatter(self, outputs: list[Tensor], input_lists: list[list[Tensor]],
                    opts: Any) -> RustdistWork:
            """scatter from group rank ``opts.rootRank`` (``input_lists`` is empty elsewhere)."""
            _check_rooted("scatter", opts, self.rank(), self.size(), outputs, input_lists)
            scatter_list = input_lists[0] if input_lists else None
            work = _api().scatter(outputs[0], scatter_list, group=self, async_op=True,
                                  group_src=_root(opts))
            return self._work([work], [outputs[0]])

        @_not_traced
        def barrier(self, opts: Any = None) -> Optional[RustdistWork]:
            """A barrier over the group (device ids in ``opts`` are ignored: CPU only), within
            ``opts.timeout`` when torch's ``barrier(timeout=...)`` set one."""
            timeout = getattr(opts, "timeout", None)
            if timeout is not None and timeout < timedelta(0):
                timeout = None  # torch's "unset"
            if not _async(opts):
                _api().barrier(group=self, timeout=timeout)
                return None
            return self._work([_api().barrier(group=self, async_op=True, timeout=timeout)], [])

        @_not_traced
        def monitored_barrier(self, timeout: Optional[timedelta] = None,
                              wait_all_ranks: bool = False) -> None:
            """A barrier that names the ranks that failed to reach it within ``timeout``
            (rank 0 reports the first such rank, or all of them with ``wait_all_ranks``)."""
            _api().monitored_barrier(group=self, timeout=timeout, wait_all_ranks=wait_all_ranks)

        # -- point-to-point ---------------------------------------------------------------

        @_not_traced
        def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> RustdistWork:
            """Sends ``tensors[0]`` to group rank ``dst``."""
            work = _api().isend(tensors[0], group=self, tag=tag, group_dst=dst)
            return self._work([work], [tensors[0]])

        @_not_traced
        def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> RustdistWork:
            """Receives ``tensors[0]`` from group rank ``src``."""
            work = _api().irecv(tensors[0], group=self, tag=tag, group_src=src)
            return self._work([work], [tensors[0]])

        @_not_traced
        def recv_anysource(self, tensors: list[Tensor], tag: int = 0) -> RustdistWork:
            """Receives ``tensors[0]`` from any rank; the Work's ``_source_rank()`` says
            which (group rank)."""
            work = _api().irecv(tensors[0], group=self, tag=tag)
            return self._work([work], [tensors[0]])

        recvAnysource = recv_anysource  # noqa: N815 - the C++ name

    def _all_gather_into_tensor_out(input: Tensor, group_size: int,  # noqa: A002
                                    group_name: str, *, out: Tensor) -> Tensor:
        """Kernel of ``_c10d_functional.all_gather_into_tensor_out`` on CPU.

        torch's C++ kernel asks the group for its per-device C++ backend, which a Python
        group lacks; this one calls the group's ``all_gather_single`` (any torch group)."""
        group = _private.resolve_group(group_name)
        group.all_gather_single(out, input.contiguous(), _private.allgather_options()).wait()
        return out

    def _create(opts: Any, pg_options: Any) -> GroupBase:
        """The creator torch calls (``extended_api=True``) to build a rustdist group."""
        ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
        return _api()._new_process_group(
            store=opts.store,
            rank=opts.group_rank,
            size=opts.group_size,
            timeout=opts.timeout,
            group_name=opts.group_id,
            global_ranks=ranks,
        )

    _kernels: list[Any] = []  # the torch.library registration, kept alive

    def register() -> None:
        """Registers backend ``"rustdist"`` with ``torch.distributed`` for CPU and CUDA tensors
        (CUDA ones run on NCCL through rustdist.cuda), and the functional-collective kernel
        it needs. A no-op when already registered."""
        if hasattr(_td.Backend, BACKEND_NAME.upper()):
            return
        _td.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                     devices=["cpu", "cuda"])
        if not _kernels:
            _kernels.append(_private.register_functional_cpu_kernel(
                "all_gather_into_tensor_out", _all_gather_into_tensor_out))


__all__ = ["BACKEND_NAME", "GroupBase", "register"]
