"""rustdist as a ``torch.distributed`` backend: the torch front door.

With torch importable, :class:`ProcessGroup` adds to the group of ``_group`` the methods
torch's Python API and its C++ code (DDP, functional collectives, DTensor, FSDP2) call on a
backend (``allreduce``, ``allgather``, ``broadcast``, ...): they make gloo's argument checks
(``_gloo_checks``) and run the operation's body in ``_ops`` on ``self``. So one group object
serves both ``import rustdist as dist`` and ``torch.distributed`` with backend
``"rustdist"``; without torch it is ``_group``'s class as it is.

:func:`register` registers the backend with ``torch.distributed.Backend.register_backend``
(idempotent, devices cpu and cuda); ``init_process_group("rustdist")`` and
``"cpu:rustdist,cuda:rustdist"`` then send CPU and CUDA tensors through rustdist. Importing
this module also sets up the engine's fast path (``_core.fast_init``) and installs the fast
methods of the group class.
"""

from datetime import timedelta
from typing import Any, Optional, Union

from . import _core, _debug, _group, _ops, status
from ._group import BACKEND_NAME
from ._work import Work, seconds

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch
    import torch.distributed as _td
except ImportError:
    torch = None  # type: ignore[assignment]
    _td = None  # type: ignore[assignment]


def new_process_group(store: Any, rank: int, size: int, timeout: Union[timedelta, float],
                      group_name: str, global_ranks: list[int],
                      backend: str = BACKEND_NAME, world: bool = False) -> _group.ProcessGroup:
    """A group over ``store`` (a rustdist store or a torch one) of ``size`` ranks, this one
    being group rank ``rank``; ``global_ranks`` are the members' global ranks by group rank.
    Collective over the members. Touches no world state (torch's backend registry calls it)
    but, for the ``world``'s group, publishing where this rank answers status queries."""
    _debug.apply_env()
    core = _core.ProcessGroup(store, rank, size, seconds(timeout), group_name)
    pg = ProcessGroup(core, list(global_ranks), backend, world=False, store=store)
    pg._is_world = world
    _group.made_by_torch.add(pg)
    if world:
        status.publish(store, rank, size, core.status_address)
    return pg


if torch is None:
    ProcessGroup = _group.ProcessGroup

    def register() -> None:
        """Registers nothing: torch is not installed."""

else:
    from torch import Tensor

    from . import _torch_private as _private
    from . import _world
    from ._gloo_checks import (
        check_alike,
        check_allgather,
        check_allreduce,
        check_allreduce_coalesced,
        check_reduce,
        check_root,
        check_rooted,
    )
    from ._reduce_op import ReduceOp
    from ._tensor import REAL_TORCH_CODES
    from ._tracing import not_traced

    #: torch's shrink flags (``torch.distributed.distributed_c10d.SHRINK_ABORT``).
    _SHRINK_ABORT = 1

    def _op(opts: Any) -> Any:
        """The ReduceOp of torch's options object (or a bare ReduceOp, as Python callers
        pass); SUM without options."""
        return _td.ReduceOp.SUM if opts is None else getattr(opts, "reduceOp", opts)

    #: Whether torch reads a synchronous call's None as "the backend has synchronised".
    _NONE_IS_SYNCED = _private.sync_call_takes_no_work()

    def _async(opts: Any) -> bool:
        """Whether the caller may overlap the operation: torch's Python API says so in
        ``asyncOp``. False: it would wait at once, so the operation runs right away on the
        calling thread and the method returns None, which torch reads as "the backend has
        synchronised" (where it does: not torch 2.6, which always waits on a Work); C++
        callers (DDP, functional collectives) leave the default, True."""
        return getattr(opts, "asyncOp", True) or not _NONE_IS_SYNCED

    def _handed(work: Work, outputs: list[Tensor]) -> Work:
        """``work`` as torch gets it: ``outputs`` are what its ``result()`` and future hold,
        its future is typed for torch's C++, and functional collectives can find it."""
        work._outputs = outputs
        work._for_torch = True
        _private.keep_for_functional_collectives(work, outputs)
        _private.register_inflight_outputs(work, outputs)
        return work

    # The fast path calls these makers from C, so dynamo would trace them from compiled code.
    @not_traced
    def _new_work(work: Any, outputs: list[Tensor]) -> Work:
        """The Work of an asynchronous call the fast functions ran: the engine's ``work``,
        with ``outputs``."""
        return Work(work, outputs)

    @not_traced
    def _handed_new(work: Any, outputs: list[Tensor]) -> Work:
        """The Work of an asynchronous call the fast methods ran: the engine's ``work``, with
        ``outputs``, as :func:`_handed` gives it to torch."""
        return _handed(Work(work, outputs), outputs)

    class ProcessGroup(_group.ProcessGroup):  # type: ignore[no-redef]
        """A ``torch.distributed.ProcessGroup`` whose collectives run on rustdist's engine.

        torch's Python API and C++ (DDP, functional collectives, DTensor, FSDP2) call the
        methods below with group ranks and torch's option objects; each runs the operation on
        ``self`` and returns a ``Work`` (None for a synchronous call of torch's Python API).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._td_name: Optional[str] = None
            self._td_desc = ""

        # -- identity ---------------------------------------------------------------------

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            """The backend's name, ``"rustdist"``."""
            return BACKEND_NAME

        def getGroupName(self) -> str:  # noqa: N802
            """The name torch registered the group under (the engine group's name before)."""
            return self._td_name if self._td_name is not None else self.group_name

        def setGroupName(self, name: str) -> None:  # noqa: N802
            """Called by torch when it registers the group."""
            self._td_name = name
            self._trace_as(name, self._trace[1])

        def getGroupDesc(self) -> str:  # noqa: N802
            """The group's description (torch's ``group_desc``)."""
            return self._td_desc

        def setGroupDesc(self, desc: str) -> None:  # noqa: N802
            """Called by torch when it registers the group."""
            self._td_desc = desc
            self._trace_as(self._trace[0], desc)

        def _get_backend(self, device: Any) -> "ProcessGroup":
            """The backend serving ``device``: this group, for every device."""
            return self

        get_backend = _get_backend  # torch 2.14's public name (``get_backend_impl``)

        # -- what torch 2.14+ asks of a group's backend (ProcessGroup forwards these) ----

        def _get_sequence_number_for_group(self) -> int:
            """The number of collectives issued on the group (torch's sequence number)."""
            return self._pg.sequence_number

        def get_group_store(self) -> Any:
            """The store the group was made on."""
            return self._store

        def _has_hooks(self) -> bool:
            """Whether on-completion hooks are registered: rustdist has none."""
            return False

        @property
        def use_pg_for_symm_mem_rendezvous(self) -> bool:
            """Symmetric memory does not rendezvous over rustdist groups (as over gloo's)."""
            return False

        def _wait_for_pending_works(self) -> None:
            """torch's NCCL-only call, refused in its words (as gloo refuses it)."""
            raise RuntimeError("Only ProcessGrouppNCCL supports waitForPendingWorks, but got "
                               f"{BACKEND_NAME} backend.")

        @property
        def supports_splitting(self) -> bool:
            """``split_group`` is not supported (it needs an accelerator in torch too)."""
            return False

        @property
        def supports_coalescing(self) -> bool:
            """Coalesced ops go through the ``*_coalesced`` methods, not start/end."""
            return False

        @property
        def supports_shrinking(self) -> bool:
            """``shrink_group`` is supported (``shrink``)."""
            return True

        @not_traced
        def shrink(self, excluded_ranks: list[int], shrink_flags: int = 0,
                   pg_options: Any = None) -> "ProcessGroup":
            """The group of this group's ranks but ``excluded_ranks`` (group ranks), for
            torch's ``shrink_group``, which only the remaining ranks call: the same links and
            store, no new rendezvous, ranks renumbered in order. ``shrink_flags`` 1
            (``SHRINK_ABORT``) aborts this group's pending operations first; 0 raises when
            operations are pending, unless the group has failed (a rank died). ``pg_options``
            is ignored (torch's backends' options)."""
            group = self._shrunk(sorted(excluded_ranks), shrink_flags == _SHRINK_ABORT)
            _group.made_by_torch.add(group)
            return group

        @not_traced
        def shutdown(self) -> None:
            """Leaves the group cleanly (``destroy_process_group`` calls this)."""
            self._shutdown()

        # -- collectives ------------------------------------------------------------------

        @not_traced
        def allreduce(self, tensors: list[Tensor], opts: Any = None) -> Optional[Work]:
            """all_reduce of each tensor (torch's AllreduceOptions give the op)."""
            if isinstance(tensors, Tensor):
                tensors = [tensors]
            check_allreduce(tensors)
            if len(tensors) != 1:  # one call, so that a tensor listed twice is reduced once
                return self.allreduce_coalesced(tensors, opts)
            if not _async(opts):
                return _ops.all_reduce(self, tensors[0], _op(opts), False)
            return _handed(_ops.all_reduce(self, tensors[0], _op(opts), True), list(tensors))

        @not_traced
        def allreduce_coalesced(self, tensors: list[Tensor],
                                opts: Any = None) -> Optional[Work]:
            """all_reduce_coalesced of the list as one call: a tensor listed twice is reduced
            once. Sparse tensors are refused, as gloo refuses them (only all_reduce sums
            them)."""
            tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
            check_allreduce_coalesced(tensors)
            if not _async(opts):
                return _ops.all_reduce_coalesced(self, tensors, _op(opts), False)
            return _handed(_ops.all_reduce_coalesced(self, tensors, _op(opts), True), tensors)

        @not_traced
        def broadcast(self, tensors: list[Tensor], opts: Any) -> Optional[Work]:
            """broadcast from group rank ``opts.rootRank``."""
            if isinstance(tensors, Tensor):
                tensors = [tensors]
            root = opts.rootRank
            check_root("broadcast", root, self.size(), getattr(opts, "rootTensor", 0),
                       len(tensors))
            check_alike("broadcast", tensors, tensors[0])
            if not _async(opts):
                for t in tensors:
                    _ops.broadcast(self, t, root, False)
                return None
            works = [_ops.broadcast(self, t, root, True) for t in tensors]
            return _handed(_ops.joined(works, list(tensors), True), list(tensors))

        @not_traced
        def reduce(self, tensors: list[Tensor], opts: Any) -> Work:
            """reduce to group rank ``opts.rootRank``."""
            check_reduce(tensors, opts, self.size())
            t = tensors[0]
            return _handed(_ops.reduce(self, t, opts.rootRank, _op(opts), True), [t])

        @not_traced
        def allgather(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                      opts: Any = None) -> Work:
            """all_gather of ``inputs[0]`` into ``output_lists[0]``."""
            check_allgather(output_lists, inputs, self.size())
            out = output_lists[0]
            return _handed(_ops.all_gather(self, out, inputs[0], True), list(out))

        @not_traced
        def allgather_coalesced(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                                opts: Any = None) -> Work:
            """all_gather_coalesced: ``output_lists`` laid out as torch's Python API has it."""
            work = _ops.all_gather_coalesced(self, output_lists, inputs, True)
            return _handed(work, [t for o in output_lists for t in o])

        @not_traced
        def _allgather_base(self, output: Tensor, input: Tensor,  # noqa: A002
                            opts: Any = None) -> Optional[Work]:
            """all_gather_into_tensor: ``output`` holds every rank's ``input`` in rank order."""
            if not _async(opts):
                return _ops.all_gather_into_tensor(self, output, input, False)
            return _handed(_ops.all_gather_into_tensor(self, output, input, True), [output])

        all_gather_single = _allgather_base

        @not_traced
        def allgather_into_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                            opts: Any = None) -> Work:
            """all_gather_into_tensor of each input/output pair."""
            work = _ops.pairs_coalesced("all_gather_into_tensor", self, outputs, inputs)
            return _handed(work, list(outputs))

        all_gather_single_coalesced = allgather_into_tensor_coalesced

        @not_traced
        def reduce_scatter(self, outputs: list[Tensor], input_lists: list[list[Tensor]],
                           opts: Any = None) -> Work:
            """reduce_scatter: ``outputs[0]`` gets the reduction of every rank's
            ``input_lists[0][rank]``. Runs as reduce_scatter_tensor over the stacked list."""
            out = outputs[0]
            stacked = torch.stack([t.reshape(out.shape) for t in input_lists[0]])
            return _handed(_ops.reduce_scatter_tensor(self, out, stacked, _op(opts), True),
                           [out])

        @not_traced
        def _reduce_scatter_base(self, output: Tensor, input: Tensor,  # noqa: A002
                                 opts: Any = None) -> Optional[Work]:
            """reduce_scatter_tensor: rank r gets the reduction of block r of ``input``."""
            if not _async(opts):
                return _ops.reduce_scatter_tensor(self, output, input, _op(opts), False)
            work = _ops.reduce_scatter_tensor(self, output, input, _op(opts), True)
            return _handed(work, [output])

        reduce_scatter_single = _reduce_scatter_base

        @not_traced
        def reduce_scatter_tensor_coalesced(self, outputs: list[Tensor], inputs: list[Tensor],
                                            opts: Any = None) -> Work:
            """reduce_scatter_tensor of each input/output pair."""
            work = _ops.pairs_coalesced("reduce_scatter_tensor", self, outputs, inputs,
                                        _op(opts))
            return _handed(work, list(outputs))

        reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

        @not_traced
        def all_to_all_single(self, output: Tensor, input: Tensor,  # noqa: A002
                              output_split_sizes: list[int], input_split_sizes: list[int],
                              opts: Any = None) -> Work:
            """all_to_all_single; empty split lists mean equal splits."""
            work = _ops.all_to_all_single(self, output, input, output_split_sizes or None,
                                          input_split_sizes or None, True)
            return _handed(work, [output])

        alltoall_base = all_to_all_single

        @not_traced
        def alltoall(self, outputs: list[Tensor], inputs: list[Tensor],
                     opts: Any = None) -> Work:
            """all_to_all: ``outputs[r]`` receives rank r's ``inputs[rank]``."""
            return _handed(_ops.all_to_all(self, outputs, inputs, True), list(outputs))

        @not_traced
        def gather(self, output_lists: list[list[Tensor]], inputs: list[Tensor],
                   opts: Any) -> Work:
            """gather to group rank ``opts.rootRank`` (``output_lists`` is empty elsewhere)."""
            check_rooted("gather", opts, self.rank(), self.size(), inputs, output_lists)
            gather_list = list(output_lists[0]) if output_lists else []
            work = _ops.gather(self, inputs[0], gather_list, opts.rootRank, True)
            return _handed(work, gather_list)

        @not_traced
        def scatter(self, outputs: list[Tensor], input_lists: list[list[Tensor]],
                    opts: Any) -> Work:
            """scatter from group rank ``opts.rootRank`` (``input_lists`` is empty elsewhere)."""
            check_rooted("scatter", opts, self.rank(), self.size(), outputs, input_lists)
            scatter_list = list(input_lists[0]) if input_lists else []
            work = _ops.scatter(self, outputs[0], scatter_list, opts.rootRank, True)
            return _handed(work, [outputs[0]])

        @not_traced
        def barrier(self, opts: Any = None) -> Optional[Work]:
            """A barrier over the group (device ids in ``opts`` are ignored: CPU only), within
            ``opts.timeout`` when torch's ``barrier(timeout=...)`` set one."""
            timeout = getattr(opts, "timeout", None)
            if timeout is not None and timeout < timedelta(0):
                timeout = None  # torch's "unset"
            if not _async(opts):
                return _ops.barrier(self, False, timeout)
            return _handed(_ops.barrier(self, True, timeout), [])

        @not_traced
        def monitored_barrier(self, timeout: Optional[timedelta] = None,
                              wait_all_ranks: bool = False) -> None:
            """A barrier that names the ranks that failed to reach it within ``timeout``
            (rank 0 reports the first such rank, or all of them with ``wait_all_ranks``)."""
            if timeout is None:
                timeout = _group.default_pg_timeout
            _ops.monitored_barrier(self, timeout, wait_all_ranks)

        # -- point-to-point ---------------------------------------------------------------

        @not_traced
        def send(self, tensors: list[Tensor], dst: int, tag: int = 0) -> Work:
            """Sends ``tensors[0]`` to group rank ``dst``."""
            peer = _world.peer(self, None, dst, "isend", "destination")
            return _handed(_ops.isend(self, tensors[0], peer, tag), [tensors[0]])

        @not_traced
        def recv(self, tensors: list[Tensor], src: int, tag: int = 0) -> Work:
            """Receives ``tensors[0]`` from group rank ``src``."""
            peer = _world.peer(self, None, src, "irecv", "source")
            return _handed(_ops.irecv(self, tensors[0], peer, tag), [tensors[0]])

        @not_traced
        def recv_anysource(self, tensors: list[Tensor], tag: int = 0) -> Work:
            """Receives ``tensors[0]`` from any rank; the Work's ``_source_rank()`` says
            which (group rank)."""
            return _handed(_ops.irecv(self, tensors[0], None, tag), [tensors[0]])

        recvAnysource = recv_anysource  # noqa: N815 - the C++ name

    def _install_fast_methods() -> None:
        """The group methods torch's hot calls reach become Python methods with the same
        parameters that pass them on to a fast builtin (``_core.fast_function``): a Python
        function, so that pybind11 takes it for an override when torch's C++ calls the group.
        Their aliases (``all_gather_single``, ...) are whatever names the class binds to the
        same function. The builtin returns no Work from a synchronous call, so they are
        installed only where torch reads that as "synchronised" (not torch 2.6)."""
        for name in ("allreduce", "broadcast", "_allgather_base", "_reduce_scatter_base",
                     "barrier"):
            python = ProcessGroup.__dict__[name]
            builtin = _core.fast_function(name, python, __name__, python.__doc__ or "",
                                          method=True)
            method = _debug.compiled_like(python, "    return fast({call})\n", {"fast": builtin})
            for attr in [a for a, v in vars(ProcessGroup).items() if v is python]:
                setattr(ProcessGroup, attr, method)

    # The engine's fast path reads rustdist groups (exactly this class), the default group
    # (``_world._default_pg``), the DETAIL flag (``_debug.detail``) and whether a profiler
    # records (``torch.autograd.profiler._is_profiler_enabled``); an asynchronous call returns
    # a ``Work``, handed to torch (``_handed_new``) from the group's methods.
    _core.fast_init(torch.Tensor, dict(REAL_TORCH_CODES), ReduceOp.SUM, ReduceOp, _world,
                    ProcessGroup, _debug, _debug.log_failure, torch.autograd.profiler, _new_work,
                    _handed_new)
    if _NONE_IS_SYNCED:
        _install_fast_methods()

    def _all_gather_into_tensor_out(input: Tensor, group_size: int,  # noqa: A002
                                    group_name: str, *, out: Tensor) -> Tensor:
        """Kernel of ``_c10d_functional.all_gather_into_tensor_out`` on CPU.

        torch's C++ kernel asks the group for its per-device C++ backend, which a Python
        group lacks; this one calls the group's ``all_gather_single`` (any torch group)."""
        group = _private.resolve_group(group_name)
        group.all_gather_single(out, input.contiguous(), _private.allgather_options()).wait()
        return out

    def _create(opts: Any, pg_options: Any) -> ProcessGroup:
        """The creator torch calls (``extended_api=True``) to build a rustdist group."""
        # torch names no members for its default group (the world) alone.
        world = not opts.global_ranks_in_group
        ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
        return new_process_group(store=opts.store, rank=opts.group_rank, size=opts.group_size,
                                 timeout=opts.timeout, group_name=opts.group_id,
                                 global_ranks=ranks, world=world)

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
            _private.shrink_python_groups()


__all__ = ["BACKEND_NAME", "ProcessGroup", "new_process_group", "register"]
