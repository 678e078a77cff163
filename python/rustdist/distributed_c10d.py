"""The torch.distributed API over the rustdist engine: world state, init, groups, collectives,
point-to-point and ``Work``. Signatures, defaults and errors follow
``torch.distributed.distributed_c10d``; tensors are torch CPU tensors or numpy arrays, passed
to ``_core`` zero-copy."""

from __future__ import annotations

import os
import threading
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qsl, urlparse

from . import _core
from ._errors import DistNetworkError, DistStoreError
from ._reduce_op import ReduceOp, op_code, supports_complex
from ._tensor import COMPLEX_CODES, ITEMSIZE, buffer

_TorchFuture: Any = None
try:  # torch is optional: without it get_future() returns a minimal future.
    import torch.futures

    _TorchFuture = torch.futures.Future
except ImportError:
    pass

#: Default timeout of process groups (torch's ``default_pg_timeout``).
default_pg_timeout: timedelta = timedelta(minutes=30)


class Backend(str):
    """An enum-like class for backends (torch.distributed's ``Backend``).

    ``Backend(name)`` returns the lowercase name as a ``str`` (``Backend("GLOO") == "gloo"``);
    the known names are attributes, e.g. ``Backend.GLOO``. rustdist runs every CPU backend
    name it accepts (``rustdist``, ``gloo``, ``cpu:gloo``, ``cpu:rustdist``) on its own engine.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    FAKE = "fake"
    RUSTDIST = "rustdist"

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        """Return the parsed lowercase backend name."""
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        return name.lower() if value == Backend.UNDEFINED else value


# Backend names init_process_group accepts; None means rustdist.
_SUPPORTED_BACKENDS = ("rustdist", "gloo", "cpu:gloo", "cpu:rustdist")


class ProcessGroup:
    """A process group: the engine's group (``_core.ProcessGroup``) plus the global ranks of
    its members, ordered by group rank. Pass it as ``group=`` to any collective."""

    __slots__ = ("_pg", "_ranks", "_group_ranks", "_rank", "_size", "_backend")

    def __init__(self, pg: Any, ranks: list[int], backend: str, world: bool) -> None:
        self._pg = pg
        self._ranks = ranks
        # global -> group rank; None on WORLD, where both are the same
        self._group_ranks: Optional[dict[int, int]] = (
            None if world else {g: i for i, g in enumerate(ranks)}
        )
        self._rank: int = pg.rank
        self._size: int = pg.size
        self._backend = backend

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    @property
    def group_name(self) -> str:
        """The group's name."""
        return self._pg.group_name

    def name(self) -> str:
        """The backend's name (torch's ``ProcessGroup.name()``)."""
        return self._backend

    def _group_rank(self, global_rank: int) -> int:
        if self._group_ranks is None:
            return global_rank
        r = self._group_ranks.get(global_rank)
        if r is None:
            raise ValueError(f"Global rank {global_rank} is not part of group {self}")
        return r

    def _global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < self._size:
            raise ValueError(f"Group rank {group_rank} is not part of group {self}")
        return self._ranks[group_rank]

    def __repr__(self) -> str:
        return f"<rustdist.ProcessGroup {self.group_name!r} rank {self._rank} of {self._size}>"


# World state: the default group and the store it was built on (kept alive with the group:
# rank 0's TCPStore serves the others). _generation numbers this process's inits, so that
# re-initialising on the same store never reads an earlier init's keys.
_default_pg: Optional[ProcessGroup] = None
_default_store: Any = None
_generation = 0

_SERVER_TAG_KEY = "rustdist/server_generation"
_NOT_INITIALIZED = (
    "Default process group has not been initialized, please make sure to call init_process_group."
)


class _WorldMeta(type):
    """Meta class of ``group`` and ``GroupMember``: gives them the class property ``WORLD``."""

    @property
    def WORLD(cls) -> Optional[ProcessGroup]:  # noqa: N802 - torch's name
        return _default_pg


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """Group class. Placeholder: ``group.WORLD`` is the default group (None before init)."""


class GroupMember(metaclass=_WorldMeta):
    """Group member class: ``WORLD`` and ``NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = -100


def _group(grp: Any) -> Optional[ProcessGroup]:
    """The group to run on (``grp`` or the default); None when this rank is not a member."""
    pg = _default_pg if grp is None else grp
    if pg.__class__ is ProcessGroup:
        return pg
    if pg is None:
        raise ValueError(_NOT_INITIALIZED)
    if isinstance(pg, ProcessGroup):
        return pg
    if pg == GroupMember.NON_GROUP_MEMBER:
        return None
    raise ValueError(f"Invalid process group specified: {grp!r}")


def _not_member(op: str) -> None:
    rank = -1 if _default_pg is None else _default_pg._rank
    warnings.warn(
        f"Running {op} on global rank {rank} which does not belong to the given group.",
        stacklevel=3,
    )


def _peer(pg: ProcessGroup, rank: Optional[int], group_rank: Optional[int], op: str,
          role: str) -> int:
    """The group rank of a peer given as a global ``rank`` or as ``group_rank`` (torch's
    ``_canonicalize_group_rank``), checked against the group size."""
    if group_rank is None:
        if rank is None:
            raise ValueError("Must specify global_rank or group_rank")
        group_rank = pg._group_rank(rank)
    elif rank is not None:
        raise ValueError("Can't specify both group_rank and global_rank")
    if not 0 <= group_rank < pg._size:
        raise RuntimeError(f"{op}: invalid {role} rank: {group_rank} (group size {pg._size})")
    return group_rank


def _seconds(timeout: Union[timedelta, float]) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


# ---------------------------------------------------------------------------------------------
# Work and futures


class _Future:
    """A minimal ``torch.futures.Future`` for when torch is not installed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: list[Callable[[_Future], None]] = []

    def done(self) -> bool:
        """Whether the future has a value or an error."""
        return self._done

    def wait(self) -> Any:
        """Blocks until done; returns the value or raises the error."""
        with self._cond:
            self._cond.wait_for(lambda: self._done)
        if self._error is not None:
            raise self._error
        return self._value

    value = wait

    def _complete(self, value: Any, error: Optional[BaseException]) -> None:
        with self._cond:
            self._value, self._error, self._done = value, error, True
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for cb in callbacks:
            cb(self)

    def set_result(self, value: Any) -> None:
        """Completes the future with ``value``."""
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        """Completes the future with ``error``."""
        self._complete(None, error)

    def add_done_callback(self, fn: Callable[[_Future], None]) -> None:
        """Calls ``fn(self)`` once done (at once if done already)."""
        with self._cond:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def then(self, callback: Callable[[_Future], Any]) -> _Future:
        """A future of ``callback(self)``, run once this one is done."""
        nxt = _Future()

        def run(f: _Future) -> None:
            try:
                nxt.set_result(callback(f))
            except BaseException as e:  # noqa: BLE001 - handed to the chained future
                nxt.set_exception(e)

        self.add_done_callback(run)
        return nxt


class Work:
    """A distributed request object (torch.distributed's ``Work``), returned by collectives
    run with ``async_op=True`` and by ``isend``/``irecv``."""

    __slots__ = ("_work", "_outputs", "_timeout", "_future")

    def __init__(self, work: Any, outputs: list[Any], timeout: Optional[timedelta] = None) -> None:
        self._work = work
        self._outputs = outputs
        self._timeout = timeout  # barrier(timeout=...): the default of wait()
        self._future: Any = None

    def wait(self, timeout: Optional[Union[timedelta, float]] = None) -> bool:
        """Blocks until the operation completes and returns True; raises its error, or
        ``DistBackendError`` once ``timeout`` passes. None or zero (torch's default,
        ``timedelta(0)``) means the group's timeout."""
        if not timeout:
            timeout = self._timeout
        self._work.wait(None if timeout is None else _seconds(timeout))
        return True

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not); non-blocking."""
        return self._work.is_completed()

    def is_success(self) -> bool:
        """Whether the operation has finished successfully."""
        return self._work.is_success()

    def exception(self) -> Optional[BaseException]:
        """The operation's error, or None."""
        return self._work.exception()

    def result(self) -> list[Any]:
        """The output tensors of the operation (valid once it has completed)."""
        return list(self._outputs)

    def source_rank(self) -> int:
        """The sender's group rank, for a completed receive."""
        return self._work.source_rank()

    _source_rank = source_rank

    def get_future(self) -> Any:
        """A ``torch.futures.Future`` (a minimal future without torch) completed with the list
        of output tensors when the operation completes, or with its error."""
        if self._future is None:
            fut: Any = _TorchFuture() if _TorchFuture is not None else _Future()
            outputs = self._outputs

            def done(error: Optional[BaseException]) -> None:
                if error is None:
                    fut.set_result(outputs)
                else:
                    fut.set_exception(error)

            self._future = fut
            self._work.add_done_callback(done)
        return self._future


def _finish(work: Any, outputs: list[Any], async_op: bool) -> Optional[Work]:
    if async_op:
        return Work(work, outputs)
    work.wait()
    return None


# ---------------------------------------------------------------------------------------------
# Init and world state


def is_available() -> bool:
    """Return ``True`` if the distributed package is available."""
    return True


def is_initialized() -> bool:
    """Check if the default process group has been initialized."""
    return _default_pg is not None


def _env(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ValueError(
            "Error initializing rustdist using env:// rendezvous: "
            f"environment variable {var} expected, but not set"
        )
    return value


def _rendezvous(url: str, rank: int, world_size: int, timeout: timedelta) -> tuple[Any, int, int]:
    """The store, rank and world size that ``init_method`` (env://, tcp://, file://) names."""
    if not isinstance(url, str):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {url}")
    u = urlparse(url)
    query = dict(parse_qsl(u.query))
    if (rank != -1 or world_size != -1) and ("rank" in query or "world_size" in query):
        raise AssertionError(
            f"The url: {url} has node-specific arguments(rank, world_size) already."
        )
    if rank == -1 and "rank" in query:
        rank = int(query["rank"])
    if world_size == -1 and "world_size" in query:
        world_size = int(query["world_size"])
    what = f"Error initializing rustdist using {u.scheme}:// rendezvous: "
    if u.scheme == "env":
        rank = int(_env("RANK")) if rank == -1 else rank
        world_size = int(_env("WORLD_SIZE")) if world_size == -1 else world_size
        host, port = _env("MASTER_ADDR"), int(_env("MASTER_PORT"))
    elif u.scheme == "tcp":
        if u.port is None:
            raise ValueError(what + "port number missing")
        host, port = u.hostname or "", u.port
    elif u.scheme == "file":
        if not u.path:
            raise ValueError(what + "path missing")
    else:
        raise RuntimeError(f"No rendezvous handler for {u.scheme}://")
    if rank == -1:
        raise ValueError(what + "rank parameter missing")
    if world_size == -1:
        raise ValueError(what + "world size parameter missing")
    if u.scheme == "file":
        return _core.FileStore(u.path, world_size), rank, world_size
    if not 0 <= port < 2**16:
        raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
    return _tcp_store(host, port, rank, world_size, timeout), rank, world_size


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The TCPStore of an init: rank 0 hosts it, the others connect.

    When an init follows a destroy on the same port, a fast rank can reach the previous
    init's server before rank 0 has closed it. So rank 0 tags its server with the init
    generation, and the others reconnect (backing off) until they reach the current one."""
    tag = str(_generation).encode()
    deadline = time.monotonic() + timeout.total_seconds()
    backoff = 0.001
    while True:
        try:
            store = _core.TCPStore(host, port, world_size, rank == 0, timeout, multi_tenant=True)
            if rank == 0:
                store.set(_SERVER_TAG_KEY, tag)
                return store
            if store.get(_SERVER_TAG_KEY) == tag:
                return store
            stale: Optional[BaseException] = None
        except (DistStoreError, DistNetworkError) as e:  # the old server closed under us
            stale = e
        if rank == 0 or time.monotonic() + backoff > deadline:
            if stale is not None:
                raise stale
            raise DistStoreError(
                f"TCPStore at {host}:{port} still serves an earlier init_process_group "
                f"after {timeout}; is another job using this port?"
            )
        time.sleep(backoff)  # retry backoff while rank 0 closes its previous server
        backoff = min(2 * backoff, 0.1)


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Optional[timedelta] = None,
    world_size: int = -1,
    rank: int = -1,
    store: Optional[Any] = None,
    group_name: str = "",
    pg_options: Optional[Any] = None,
    device_id: Optional[Any] = None,
) -> None:
    """Initialize the default distributed process group.

    Either give ``store``, ``rank`` and ``world_size``, or an ``init_method`` URL: ``env://``
    (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; the default), ``tcp://host:port`` or
    ``file:///path``, with ``rank`` and ``world_size`` as arguments or in the URL query. Rank 0
    of ``env://`` and ``tcp://`` hosts the TCPStore.

    Args:
        backend: ``"rustdist"`` (the default), or ``"gloo"``, ``"cpu:gloo"``,
            ``"cpu:rustdist"`` so that unchanged torch scripts run; all use rustdist's engine.
        init_method: URL saying how to find the peers. Mutually exclusive with ``store``.
        timeout: Timeout of operations on the group (default 30 minutes).
        world_size: Number of processes; required with ``store``.
        rank: Rank of this process, in ``[0, world_size)``; required with ``store``.
        store: A rustdist store, or a torch store (any object with torch's Store methods),
            that every rank can reach. Mutually exclusive with ``init_method``.
        group_name: Ignored (deprecated in torch too).
        pg_options: Ignored (backend options of torch's backends).
        device_id: None or the CPU device; rustdist has no accelerator path yet.
    """
    global _default_pg, _default_store, _generation
    if _default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    name = Backend(backend) if backend is not None else Backend.RUSTDIST
    if name not in _SUPPORTED_BACKENDS:
        raise ValueError(
            f"Unsupported backend {backend!r}: rustdist supports "
            f"{', '.join(map(repr, _SUPPORTED_BACKENDS))} (or None, meaning 'rustdist')"
        )
    if device_id is not None and getattr(device_id, "type", device_id) != "cpu":
        raise ValueError(
            f"device_id {device_id} is not supported: rustdist runs on the CPU only "
            "(the CUDA path is not built yet)"
        )
    if timeout is None:
        timeout = default_pg_timeout
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"Expected timeout argument to be of type datetime.timedelta, got {timeout}"
        )
    if store is not None:  # torch checks these before any rendezvous
        if not world_size > 0:
            raise AssertionError("world_size must be positive if using store")
        if not rank >= 0:
            raise AssertionError("rank must be non-negative if using store")
    _generation += 1
    if store is None:
        store, rank, world_size = _rendezvous(init_method or "env://", rank, world_size, timeout)
        store.set_timeout(timeout)
    if not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank}: it must be in [0, world_size={world_size})")
    prefixed = _core.PrefixStore(f"rustdist/{_generation}", store)
    pg = _core.ProcessGroup(prefixed, rank, world_size, timeout.total_seconds(), "0")
    _default_pg = ProcessGroup(pg, list(range(world_size)), name, world=True)
    _default_store = store


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Destroy a given process group, and deinitialize the distributed package.

    Args:
        group: The process group to be destroyed; None or ``group.WORLD`` destroys the
            default group (and with it every group), after which ``init_process_group`` may
            be called again.
    """
    global _default_pg, _default_store
    if group.__class__ is int and group == GroupMember.NON_GROUP_MEMBER:
        return
    pg = _default_pg if group is None else group
    if pg is None:
        raise AssertionError("Process group cannot be None")
    if pg is not _default_pg:
        raise ValueError("Invalid process group specified")
    _default_pg = _default_store = None  # cleared first: init works again even if this fails
    pg._pg.shutdown()


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """Return the rank of the current process in ``group`` (default: the default group), or
    -1 if it is not part of the group."""
    pg = _group(group)
    return -1 if pg is None else pg._rank


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """Return the number of processes in ``group`` (default: the default group), or -1 if
    this process is not part of the group."""
    pg = _group(group)
    return -1 if pg is None else pg._size


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """Return the backend of ``group`` (default: the default group) as a lowercase string:
    the name given to ``init_process_group`` (``"rustdist"`` when none was)."""
    pg = _group(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    return pg._backend


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """Translate a global rank into a group rank; ValueError if it is not in ``group``."""
    pg = _group(group)
    if pg is None:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return pg._group_rank(global_rank)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """Translate a group rank into a global rank; ValueError if it is not in ``group``."""
    pg = _group(group)
    if pg is None:
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return pg._global_rank(group_rank)


def get_process_group_ranks(group: Optional[ProcessGroup]) -> list[int]:
    """The global ranks of ``group`` (default: the default group), ordered by group rank."""
    pg = _group(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    return list(pg._ranks)


# ---------------------------------------------------------------------------------------------
# Collectives


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Reduces the tensor data across all machines in a way that all get the final result.

    After the call ``tensor`` is bitwise identical in all processes. In place; complex
    tensors are supported (not with MIN, MAX, PRODUCT or the bitwise ops).

    Args:
        tensor: Input and output of the collective (torch CPU tensor or numpy array).
        op: A ``ReduceOp`` value (rustdist's or torch.distributed's).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    pg = _group(group)
    if pg is None:
        _not_member("all_reduce")
        return None
    ptr, n, code = buffer(tensor, "tensor", True)
    opc = op_code(op)
    if code in COMPLEX_CODES and not supports_complex(opc):
        raise ValueError(f"all_reduce does not support {op} on complex tensors")
    work = pg._pg.all_reduce(ptr, n, code, opc, tensor)
    if async_op:
        return Work(work, [tensor])
    work.wait()
    return None


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
    pg = _group(group)
    if pg is None:
        _not_member("broadcast")
        return None
    root = _peer(pg, src, group_src, "broadcast", "root")
    ptr, n, code = buffer(tensor, "tensor", True)
    return _finish(pg._pg.broadcast(ptr, n, code, root, tensor), [tensor], async_op)


def all_gather(tensor_list: list[Any], tensor: Any, group: Optional[ProcessGroup] = None,
               async_op: bool = False) -> Optional[Work]:
    """Gathers tensors from the whole group in a list.

    Args:
        tensor_list: Output list of ``world_size`` tensors, each shaped like ``tensor``;
            ``tensor_list[r]`` receives rank r's tensor.
        tensor: Tensor to be broadcast from the current process.
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    if not isinstance(tensor_list, list):
        raise TypeError(
            "Invalid function argument. Expected parameter `tensor_list` of type "
            f"List[torch.Tensor] but got {type(tensor_list)} instead."
        )
    pg = _group(group)
    if pg is None:
        _not_member("all_gather")
        return None
    in_ptr, n, code = buffer(tensor, "tensor")
    if len(tensor_list) != pg._size:
        raise RuntimeError(
            f"all_gather: tensor_list has {len(tensor_list)} tensors, expected one per rank "
            f"(world size {pg._size})"
        )
    ptrs = []
    for i, t in enumerate(tensor_list):
        p, m, c = buffer(t, "tensor_list", True)
        if c != code:
            raise ValueError(
                f"Invalid usage of tensors with different dtypes Found {t.dtype} and {tensor.dtype}"
            )
        if m != n:
            raise RuntimeError(
                f"all_gather: tensor_list[{i}] has {m} elements but `tensor` has {n} "
                "(every output must have the input's size)"
            )
        ptrs.append(p)
    work = pg._pg.all_gather(in_ptr, ptrs, n, code, (tensor, *tensor_list))
    return _finish(work, tensor_list, async_op)


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
    pg = _group(group)
    if pg is None:
        _not_member("all_gather_into_tensor")
        return None
    in_ptr, n, code = buffer(input_tensor, "input_tensor")
    out_ptr, m, out_code = buffer(output_tensor, "output_tensor", True)
    _check_pair("all_gather_into_tensor", ("output_tensor", output_tensor, m, out_code),
                ("input_tensor", input_tensor, n, code), pg._size)
    step = n * ITEMSIZE[code]
    ptrs = [out_ptr + r * step for r in range(pg._size)]
    work = pg._pg.all_gather(in_ptr, ptrs, n, code, (input_tensor, output_tensor))
    return _finish(work, [output_tensor], async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Optional[ProcessGroup] = None,
                          async_op: bool = False) -> Optional[Work]:
    """Reduces, then scatters a tensor to all ranks in a group.

    Args:
        output: Output tensor, the same size on every rank.
        input: ``world_size`` times the output's elements, as the concatenation of the
            blocks (e.g. flat) or as their stack; rank r gets the reduction of block r.
        op: A ``ReduceOp`` value (rustdist's or torch.distributed's).
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    pg = _group(group)
    if pg is None:
        _not_member("reduce_scatter_tensor")
        return None
    out_ptr, n, code = buffer(output, "output", True)
    in_ptr, m, in_code = buffer(input, "input")
    _check_pair("reduce_scatter_tensor", ("input", input, m, in_code), ("output", output, n, code),
                pg._size)
    work = pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, op_code(op), (input, output))
    return _finish(work, [output], async_op)


def _check_pair(op: str, big: tuple[str, Any, int, int], small: tuple[str, Any, int, int],
                size: int) -> None:
    """The larger tensor of all_gather_into_tensor/reduce_scatter_tensor must have the other's
    dtype and ``world_size`` times its elements. Each is ``(name, tensor, numel, code)``."""
    (big_name, big_t, big_n, big_code), (small_name, small_t, small_n, small_code) = big, small
    if big_code != small_code:
        raise RuntimeError(f"{op}: dtype mismatch, `{big_name}` is {big_t.dtype} but "
                           f"`{small_name}` is {small_t.dtype}")
    if big_n != size * small_n:
        raise RuntimeError(
            f"{op}: invalid tensor size: `{big_name}` must have world_size ({size}) * "
            f"{small_n} = {size * small_n} elements, it has {big_n} (shape {tuple(big_t.shape)})"
        )


all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


def barrier(group: Optional[ProcessGroup] = None, async_op: bool = False,
            device_ids: Optional[list[int]] = None,
            timeout: Optional[timedelta] = None) -> Optional[Work]:
    """Synchronize all processes.

    Blocks until the whole group enters this function (or, with ``async_op``, until the
    returned handle's ``wait()``).

    Args:
        group: The process group to work on (default: the default group).
        async_op: Whether this op should be an async op.
        device_ids: Ignored (accelerator ids; rustdist runs on the CPU).
        timeout: Timeout for the barrier (default: the group's timeout).

    Returns:
        Async work handle if ``async_op`` is True, else None.
    """
    pg = _group(group)
    if pg is None:
        _not_member("barrier")
        return None
    work = pg._pg.barrier()
    if async_op:
        return Work(work, [], timeout)
    work.wait(None if timeout is None else _seconds(timeout))
    return None


# ---------------------------------------------------------------------------------------------
# Point-to-point


def _send_work(tensor: Any, dst: Optional[int], group: Optional[ProcessGroup], tag: int,
               group_dst: Optional[int], op: str) -> Optional[Any]:
    pg = _group(group)
    if pg is None:
        _not_member(op)
        return None
    peer = _peer(pg, dst, group_dst, op, "destination")
    if op == "send" and peer == pg._rank:
        raise ValueError(
            "Invalid destination rank: destination rank should not be the same as "
            "the rank of the current process."
        )
    ptr, n, code = buffer(tensor, "tensor")
    return pg._pg.send(ptr, n, code, peer, tag, tensor)


_SELF_SOURCE = ("Invalid source rank: source rank should not be the same as the rank of the "
                "current process.")


def _recv_work(tensor: Any, src: Optional[int], group: Optional[ProcessGroup], tag: int,
               group_src: Optional[int], op: str) -> tuple[Optional[ProcessGroup], Any]:
    pg = _group(group)
    if pg is None:
        _not_member(op)
        return None, None
    peer = None if src is None and group_src is None else _peer(pg, src, group_src, op, "source")
    if op == "recv" and peer == pg._rank:
        raise ValueError(_SELF_SOURCE)
    ptr, n, code = buffer(tensor, "tensor", True)
    return pg, pg._pg.recv(ptr, n, code, peer, tag, tensor)


def isend(tensor: Any, dst: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_dst: Optional[int] = None) -> Optional[Work]:
    """Send a tensor asynchronously; do not modify it before the request completes.

    Args:
        tensor: Tensor to send.
        dst: Destination rank on the global process group (regardless of ``group``).
        group: The process group to work on (default: the default group).
        tag: Tag to match send with remote recv.
        group_dst: Destination rank on ``group``. Invalid to specify both.

    Returns:
        A distributed request object; None if not part of the group.
    """
    work = _send_work(tensor, dst, group, tag, group_dst, "isend")
    return None if work is None else Work(work, [tensor])


def irecv(tensor: Any, src: Optional[int] = None, group: Optional[ProcessGroup] = None,
          tag: int = 0, group_src: Optional[int] = None) -> Optional[Work]:
    """Receives a tensor asynchronously.

    Args:
        tensor: Tensor to fill with received data.
        src: Source rank on the global process group; from any process if unspecified.
        group: The process group to work on (default: the default group).
        tag: Tag to match recv with remote send.
        group_src: Source rank on ``group``. Invalid to specify both.

    Returns:
        A distributed request object; None if not part of the group.
    """
    pg, work = _recv_work(tensor, src, group, tag, group_src, "irecv")
    return None if pg is None else Work(work, [tensor])


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
    work = _send_work(tensor, dst, group, tag, group_dst, "send")
    if work is not None:
        work.wait()


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
    pg, work = _recv_work(tensor, src, group, tag, group_src, "recv")
    if pg is None:
        return -1
    work.wait()
    if src is not None:
        return src
    if group_src is None:
        group_src = work.source_rank()
        if group_src == pg._rank:
            raise ValueError(_SELF_SOURCE)
    return pg._global_rank(group_src)


__all__ = [
    "Backend", "GroupMember", "ProcessGroup", "ReduceOp", "Work", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "all_reduce", "barrier", "broadcast",
    "default_pg_timeout", "destroy_process_group", "get_backend", "get_global_rank",
    "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
    "init_process_group", "irecv", "is_available", "is_initialized", "isend", "recv",
    "reduce_scatter_single", "reduce_scatter_tensor", "send",
]
