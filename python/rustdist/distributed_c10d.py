"""The torch.distributed API over the rustdist engine: world state, init, groups, collectives,
point-to-point and ``Work``. Signatures, defaults and errors follow
``torch.distributed.distributed_c10d``; tensors are torch CPU tensors or numpy arrays, passed
to ``_core`` zero-copy."""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import threading
import time
import warnings
import weakref
from datetime import timedelta
from functools import partial
from typing import Any, Callable, Optional, Union
from urllib.parse import parse_qsl, urlparse

from . import _core, _debug, _sparse
from ._alias import READ, UPDATE, WRITE, Staged, unalias
from ._debug import exception_logger, logger
from ._errors import DistNetworkError, DistStoreError
from ._reduce_op import ReduceOp, op_args, supports_complex
from ._tensor import (
    _TORCH_CODES, COMPLEX_CODES, ITEMSIZE, REAL_TORCH_CODES, OnCuda, _Tensor, buffer, concat,
)

from ._torch_backend import GroupBase, _not_traced

_TorchFuture: Any = None
_torch_world: Any = None
try:  # torch is optional: without it get_future() returns a minimal future, and rustdist
    # keeps its world itself.
    import torch.futures

    from . import _torch_world

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


# Backends whose names init_process_group and new_group accept, alone or per device
# ("cpu:gloo,cuda:nccl"): every one runs on rustdist's engine (NCCL for CUDA tensors).
_BACKEND_NAMES = ("rustdist", "gloo", "nccl")
_DEVICES = ("cpu", "cuda")


def _backend_name(backend: Optional[str], default: str, what: str) -> str:
    """``backend`` parsed as torch parses it (``None``: ``default``); raises ValueError for a
    backend or device rustdist does not run."""
    if not backend:
        return default
    name = Backend(backend)
    for part in name.split(","):
        device, _, be = part.rpartition(":")
        if be not in _BACKEND_NAMES or device not in ("", *_DEVICES):
            raise ValueError(
                f"Unsupported backend {backend!r} for {what}: rustdist runs "
                f"{', '.join(map(repr, _BACKEND_NAMES))} (all on its own engine), alone or per "
                f"device as in 'cpu:gloo,cuda:nccl' (devices {', '.join(_DEVICES)})"
            )
    return name


def _check_device_id(device_id: Any) -> None:
    kind = getattr(device_id, "type", device_id)
    if device_id is not None and kind not in _DEVICES:
        raise ValueError(f"device_id {device_id} is not supported: rustdist runs on "
                         f"{' and '.join(_DEVICES)} devices")


class ProcessGroup(GroupBase):  # type: ignore[misc, valid-type]
    """A process group: the engine's group (``_core.ProcessGroup``, ``_pg``) plus the global
    ranks of its members ordered by group rank (``_ranks``). Pass it as ``group=`` to any
    collective."""

    def __init__(self, pg: Any, ranks: list[int], backend: str, world: bool, store: Any) -> None:
        super().__init__(pg.rank, pg.size)
        self._pg = pg
        # The group's store (its CUDA group rendezvous there) and that CUDA group, made by
        # rustdist.cuda on the first CUDA tensor.
        self._store = store
        self._cuda: Any = None
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

    @property
    def options(self) -> "_Options":
        """The backend's options (torch's ``Backend.options``; torch's door reaches them as
        ``group._get_backend(device).options``): ``options._timeout`` is the group's timeout
        as a ``timedelta``. Live: setting ``options._timeout`` sets the timeout as
        :meth:`_set_default_timeout` does."""
        return _Options(self)

    def _set_default_timeout(self, timeout: timedelta) -> None:
        """Sets the timeout of the group's operations (torch's backend
        ``_set_default_timeout``, which ``_set_pg_timeout`` calls): operations this rank
        issues after the call, CPU and CUDA, point-to-point included, fail with
        ``DistBackendError`` when they outlive it; operations issued before keep the timeout
        they were issued with. Call it on every rank of the group with the same value.

        Raises TypeError unless ``timeout`` is a ``datetime.timedelta``, ValueError when it is
        negative."""
        if not isinstance(timeout, timedelta):
            raise TypeError(
                "_set_default_timeout(): timeout must be a datetime.timedelta, got "
                f"{type(timeout).__name__}"
            )
        seconds = timeout.total_seconds()
        self._pg.set_timeout(seconds)
        if self._cuda is not None:
            self._cuda.set_timeout(seconds)

    def set_timeout(self, timeout: timedelta) -> None:
        """Sets the timeout of the group's later operations (torch's
        ``ProcessGroup.set_timeout``): as :meth:`_set_default_timeout`."""
        self._set_default_timeout(timeout)

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

    def _shutdown(self) -> None:
        """Leaves the engine group and its CUDA group (queued work still runs); forgets it as
        the default."""
        self._forget_as_default()
        if self._cuda is not None:
            _cuda().shutdown(self)
        self._pg.shutdown()

    @_not_traced
    def abort(self) -> None:
        """abort all operations and connections if supported by the backend

        Every queued and in-progress operation of the group (CPU and CUDA), whichever thread
        started or waits on it, fails within milliseconds with DistBackendError saying the
        group was aborted, and so does every later one; the peers are told, so that their
        pending and later operations on the group fail the same way. The group stays
        registered (torch's semantics): ``_abort_process_group`` or
        ``destroy_process_group`` forgets it.
        """
        if _torch_world is not None:
            self._forget_as_default()  # a cache there: _default() finds it while torch has it
        if self._cuda is not None:
            _cuda().abort(self)
        self._pg.abort()

    def _forget_as_default(self) -> None:
        global _default_pg
        if _default_pg is self:
            _default_pg = None

    def __repr__(self) -> str:
        return f"<rustdist.ProcessGroup {self.group_name!r} rank {self._rank} of {self._size}>"


class _Options:
    """A rustdist group's backend options, as torch's ``Backend.Options`` has them: read from
    the group each time (never a stale copy), and ``_timeout`` set through the group."""

    __slots__ = ("_group",)

    def __init__(self, group: ProcessGroup) -> None:
        self._group = group

    @property
    def _timeout(self) -> timedelta:
        """The group's timeout (the one operations issued now get)."""
        return timedelta(seconds=self._group._pg.timeout)

    @_timeout.setter
    def _timeout(self, value: timedelta) -> None:
        self._group._set_default_timeout(value)

    @property
    def backend(self) -> str:
        """The backend's name."""
        return self._group._backend

    @property
    def group_name(self) -> str:
        """The group's name."""
        return self._group.group_name

    @property
    def global_ranks_in_group(self) -> list[int]:
        """The members' global ranks, by group rank."""
        return list(self._group._ranks)

    def __repr__(self) -> str:
        return f"<rustdist backend options: backend {self.backend!r}, _timeout {self._timeout}>"


def _new_process_group(store: Any, rank: int, size: int, timeout: Union[timedelta, float],
                       group_name: str, global_ranks: list[int],
                       backend: str = "rustdist") -> ProcessGroup:
    """A group over ``store`` (a rustdist store or a torch one) of ``size`` ranks, this one
    being group rank ``rank``; ``global_ranks`` are the members' global ranks by group rank.
    Collective over the members. Touches no world state (for torch's backend registry)."""
    _debug.apply_env()
    core = _core.ProcessGroup(store, rank, size, _seconds(timeout), group_name)
    pg = ProcessGroup(core, list(global_ranks), backend, world=False, store=store)
    _torch_made.add(pg)
    return pg


# World state. With torch importable, torch's world is the world (see _torch_world) and
# _default_pg caches its default group, found on first use and forgotten by that group's
# shutdown; without torch, rustdist keeps the world here. _default_store is the store the
# default group was built on (kept alive with it: rank 0's TCPStore serves the others).
# _generation numbers this process's inits, so that re-initialising on the same store never
# reads an earlier init's keys.
_default_pg: Optional[ProcessGroup] = None
# The groups torch created through the "rustdist" backend, shut down by rustdist's
# destroy_process_group (torch before 2.7 does not call a Python group's shutdown).
_torch_made: weakref.WeakSet = weakref.WeakSet()
_default_store: Any = None
_generation = 0
# Subgroups of this init by name, destroyed with the default group. Names are "1", "2", ...
# counted by new_group (which every rank calls), or hashes of the ranks with
# use_local_synchronization (which only members call).
_subgroups: dict[str, ProcessGroup] = {}
_group_count = 0
_local_group_counts: dict[tuple[int, ...], int] = {}
_non_member_ranks: Optional[list[int]] = None

_SERVER_TAG_KEY = "rustdist/server_generation"
_NOT_INITIALIZED = (
    "Default process group has not been initialized, please make sure to call init_process_group."
)


def _default() -> Any:
    """The default group, or None before init: rustdist's, or (torch importable) torch's
    default group, which is a rustdist group unless torch was initialised with another
    backend. Refreshes the cache the collectives read."""
    global _default_pg
    if _torch_world is None:
        return _default_pg
    pg = _torch_world.default_group()
    _default_pg = pg if isinstance(pg, ProcessGroup) else None
    return pg


class _WorldMeta(type):
    """Meta class of ``group`` and ``GroupMember``: gives them the class property ``WORLD``."""

    @property
    def WORLD(cls) -> Optional[ProcessGroup]:  # noqa: N802 - torch's name
        return _default()


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
        pg = _default()
        if pg is None:
            raise ValueError(_NOT_INITIALIZED)
    if isinstance(pg, ProcessGroup):
        return pg
    if pg == GroupMember.NON_GROUP_MEMBER:
        return None
    if grp is None:
        raise ValueError(
            f"The default process group was created by torch.distributed with backend "
            f"{pg.name()!r}: rustdist's functions run on rustdist groups; initialise with "
            "rustdist.init_process_group or backend 'rustdist'"
        )
    raise ValueError(f"Invalid process group specified: {grp!r}")


def _not_member(op: str) -> None:
    default = _default()
    rank = -1 if default is None else default._rank
    warnings.warn(
        f"Running {op} on global rank {rank} which does not belong to the given group.",
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """warnings' stacklevel, from the caller of this function's caller, of the first frame
    outside rustdist: the user's call, past the op, its exception_logger and its fast path."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("rustdist"):
        level, frame = level + 1, frame.f_back
    return level


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
    """The Work of an asynchronous call; a synchronous one has run already (the engine ran it
    with ``sync``) or, for several engine Works, is waited for here."""
    if async_op:
        return Work(work, outputs)
    if work is not None:
        work.wait()
    return None


def _finish_cuda(works: list[Any], async_op: bool) -> Optional[Work]:
    """Several CUDA operations as one: they run in order on the group's internal stream, so
    the last one's end is the end of all."""
    last = works[-1] if works else None
    if async_op or last is None:
        return last
    last.wait()
    return None


def _cuda_work_type() -> type:
    return _cuda().CudaWork


# ---------------------------------------------------------------------------------------------
# Init and world state


def is_available() -> bool:
    """Return ``True`` if the distributed package is available."""
    return True


def is_initialized() -> bool:
    """Check if the default process group has been initialized."""
    return _default() is not None


# Where launchers put a process's rank, world size and node-local rank: torchrun (and torch's
# launch utility), then Slurm's srun, then Open MPI's mpirun.
_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def _env(*names: str) -> str:
    """The first of the environment variables ``names`` that is set (env:// rendezvous)."""
    for var in names:
        value = os.environ.get(var)
        if value:
            return value
    raise ValueError(
        "Error initializing rustdist using env:// rendezvous: "
        f"environment variable {' or '.join(names)} expected, but not set"
    )


def _get_default_store() -> Any:
    """The store the default group was initialised on (torch's private helper of this name,
    which torch's tests use); ValueError before init."""
    if _default_store is not None:
        return _default_store
    if _torch_world is not None and is_initialized():  # a world made by torch.distributed
        import torch.distributed.distributed_c10d as torch_c10d

        return torch_c10d._get_default_store()
    raise ValueError(_NOT_INITIALIZED)


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """Return the local rank of the current process relative to the node: ``LOCAL_RANK``
    (torchrun), else ``SLURM_LOCALID`` (srun), else ``OMPI_COMM_WORLD_LOCAL_RANK`` (mpirun),
    else ``fallback_rank`` if given.

    Raises:
        RuntimeError: if no launcher set a local rank and ``fallback_rank`` is None.
    """
    for var in _LOCAL_RANK_VARS:
        if var in os.environ:
            return int(os.environ[var])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow "
        "`get_node_local_rank` to work, assuming you are not running in a multi-device "
        "context and want the code to run locally instead."
    )


def _agent_store() -> bool:
    """torchrun's agent already serves the store on MASTER_ADDR:MASTER_PORT."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _store_prefix() -> str:
    """Keys of this init: apart from earlier inits of this process, and (under torchrun,
    whose store outlives restarts) from earlier attempts of the job."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"rustdist/{attempt}/{_generation}"


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
        rank = int(_env(*_RANK_VARS)) if rank == -1 else rank
        world_size = int(_env(*_SIZE_VARS)) if world_size == -1 else world_size
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
    if _agent_store():
        if _torch_world is None:
            raise RuntimeError("torchrun's agent store needs torch (its TCPStore protocol)")
        import torch.distributed as td

        return td.TCPStore(host, port, world_size, False, timeout=timeout), rank, world_size
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
    of ``env://`` and ``tcp://`` hosts the TCPStore; under torchrun every rank joins the store
    its agent serves. Without RANK and WORLD_SIZE, ``env://`` reads Slurm's (SLURM_PROCID,
    SLURM_NTASKS) or Open MPI's (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), so ``srun`` and
    ``mpirun`` launch rustdist programs directly.

    With torch importable the group is torch's default group too (created through
    ``torch.distributed.init_process_group`` with backend ``"rustdist"``): DDP, FSDP2,
    DeviceMesh, DTensor and every torch API without ``group=`` run on rustdist's engine.

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

    ``TORCH_DISTRIBUTED_DEBUG`` (or ``RUSTDIST_DEBUG``), when set, sets the debug level here
    as well as at import.
    """
    global _default_pg, _default_store, _generation
    if is_initialized():
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    name = _backend_name(backend, Backend.RUSTDIST, "init_process_group")
    _check_device_id(device_id)
    if timeout is None:
        timeout = default_pg_timeout
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"Expected timeout argument to be of type datetime.timedelta, got {timeout}"
        )
    _debug.apply_env()
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
    if _torch_world is not None:
        pg = _torch_world.init(store, _store_prefix(), rank, world_size, timeout)
    else:
        prefixed = _core.PrefixStore(_store_prefix(), store)
        core = _core.ProcessGroup(prefixed, rank, world_size, timeout.total_seconds(), "0")
        pg = ProcessGroup(core, list(range(world_size)), name, world=True, store=prefixed)
    pg._backend = name
    _default_pg = pg
    _default_store = store
    logger.info("rank %d: initialized the default process group (backend %s, world size %d)",
                rank, name, world_size)


def _end_groups(group: Optional[ProcessGroup], how: str, end: str, torch_end: str,
                invalid: str) -> None:
    """What destroy_process_group and _abort_process_group share: ends ``group`` with its
    method ``end`` (``_shutdown`` or ``abort``; in torch's world after ``_torch_world``'s
    ``torch_end``) and forgets it; None or ``group.WORLD`` ends the default group and every
    subgroup (newest first, as torch does), after which ``init_process_group`` may be called
    again. ``how`` names it in the log; ``invalid`` is the error for a group that is not one
    of this world's."""
    global _default_pg, _default_store, _group_count, _non_member_ranks
    if group.__class__ is int and group == GroupMember.NON_GROUP_MEMBER:
        return
    default = _default()
    pg = default if group is None else group
    if pg is None:
        raise AssertionError("Process group cannot be None")
    if _torch_world is not None:
        logger.info("%s process group %s", how, getattr(pg, "group_name", pg))
        getattr(_torch_world, torch_end)(group)
        for gone in list(_torch_made) if pg is default else [pg]:
            getattr(gone, end)()  # done already by newer torch; a repeat is a no-op
        if pg is default:
            _default_pg = _default_store = None
            _non_member_ranks = None
        return
    if pg is not _default_pg:
        if _subgroups.get(getattr(pg, "group_name", None)) is not pg:
            raise ValueError(invalid)
        del _subgroups[pg.group_name]
        logger.info("%s process group %s (ranks %s)", how, pg.group_name, pg._ranks)
        getattr(pg, end)()
        return
    subgroups = list(_subgroups.values())
    # cleared first: init works again even if ending a group fails
    _default_pg = _default_store = None
    _subgroups.clear()
    _local_group_counts.clear()
    _group_count = 0
    _non_member_ranks = None
    logger.info("rank %d: %s the default process group and %d subgroups", pg._rank, how,
                len(subgroups))
    for sub in reversed(subgroups):
        getattr(sub, end)()
    getattr(pg, end)()


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Destroy a given process group, and deinitialize the distributed package.

    Args:
        group: The process group to be destroyed; None or ``group.WORLD`` destroys the
            default group (and with it every group), after which ``init_process_group`` may
            be called again. A subgroup (from ``new_group``) is destroyed alone.
    """
    _end_groups(group, "destroying", "_shutdown", "destroy", "Invalid process group specified")


def _abort_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Abort a given process group. If group.WORLD (i.e. `None`) is given, all process groups
    including the default one will be aborted.

    Args:
        group (ProcessGroup, optional): The process group to be aborted.

    Each group's ``abort()`` fails its queued and in-progress operations on every thread (and
    tells the peers); the aborted groups are then forgotten as ``destroy_process_group``
    forgets them, so that after aborting the world ``init_process_group`` may be called again.
    Unlike torch's (NCCL only), this works on every rustdist group.
    """
    _end_groups(group, "aborting", "abort", "abort",
                "Invalid process group specified or has been destroyed.")


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


def _registered(group: Any) -> dict[int, int]:
    """global -> group rank of a group made by new_group. Like torch, NON_GROUP_MEMBER maps to
    the ranks of the last group this rank was not a member of."""
    if group.__class__ is int and group == GroupMember.NON_GROUP_MEMBER:
        if _non_member_ranks is not None:
            return {g: i for i, g in enumerate(_non_member_ranks)}
    elif isinstance(group, ProcessGroup) and (
        group is _default() or _subgroups.get(group.group_name) is group
        or group._group_ranks is not None
    ):
        return {g: i for i, g in enumerate(group._ranks)}
    raise ValueError(
        f"Group {group} is not registered, please create group with "
        "torch.distributed.new_group API"
    )


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """Translate a global rank into a group rank.

    ``global_rank`` must be part of ``group`` otherwise this raises ValueError. Calling this
    function on the default process group returns identity.
    """
    if group is not None and group is _default():
        return global_rank
    ranks = _registered(group)
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return ranks[global_rank]


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """Translate a group rank into a global rank.

    ``group_rank`` must be part of ``group`` otherwise this raises ValueError. Calling this
    function on the default process group returns identity.
    """
    if group is not None and group is _default():
        return group_rank
    for global_rank, rank in _registered(group).items():
        if rank == group_rank:
            return global_rank
    raise ValueError(f"Group rank {group_rank} is not part of group {group}")


def get_process_group_ranks(group: Optional[ProcessGroup]) -> list[int]:
    """Get all global ranks of ``group`` (None: the default group), ordered by group rank."""
    if group is None:
        default = _default()
        if default is None:
            raise ValueError(_NOT_INITIALIZED)
        return list(default._ranks)
    try:
        return list(_registered(group))
    except ValueError:
        raise KeyError(group) from None  # torch looks the group up in a dict


def _check_timeout(timeout: Any) -> timedelta:
    if timeout is None:
        return default_pg_timeout
    if not isinstance(timeout, timedelta):
        raise TypeError(
            f"Expected timeout argument to be of type datetime.timedelta, got {timeout}"
        )
    return timeout


def _set_pg_timeout(timeout: timedelta, group: Optional[ProcessGroup] = None) -> None:
    """Set the timeout for the given process group when users want to use a different timeout
    instead of default values.

    Args:
        timeout (timedelta): Timeout for operations executed against the process group which
            users want to set. Default value is 30 minutes. Operations this rank issues after
            the call get it (CPU and CUDA ones, point-to-point included); those issued before
            keep theirs. Call it on every rank of the group.
        group (ProcessGroup, optional): The process group to work on. The default is the
            general main process group. If another specific group is specified, the calling
            process must be part of :attr:`group`.

    Raises ValueError "Invalid process group specified" on a rank that is not a member of
    ``group``. A group torch made with another backend is passed on to
    ``torch.distributed.distributed_c10d._set_pg_timeout``.
    """
    if group is None:
        group = _default()
        if group is None:
            raise ValueError(_NOT_INITIALIZED)
    if isinstance(group, int) and group == GroupMember.NON_GROUP_MEMBER:
        raise ValueError("Invalid process group specified")
    if isinstance(group, ProcessGroup):
        group._set_default_timeout(timeout)
        return
    if _torch_world is not None:
        import torch.distributed as td

        if isinstance(group, td.ProcessGroup):
            td.distributed_c10d._set_pg_timeout(timeout, group)
            return
    raise AssertionError(f"Expected ProcessGroup, got {type(group)}")


@exception_logger
def new_group(ranks: Optional[list[int]] = None, timeout: Optional[timedelta] = None,
              backend: Optional[str] = None, pg_options: Optional[Any] = None,
              use_local_synchronization: bool = False, group_desc: Optional[str] = None,
              device_id: Optional[Any] = None, sort_ranks: bool = True) -> Any:
    """Create a new distributed group.

    This function requires that all processes in the main group (i.e. all processes that are
    part of the distributed job) enter this function, even if they are not going to be
    members of the group, and that they create groups in the same order. With
    ``use_local_synchronization=True`` only the members call it.

    Args:
        ranks: List of ranks of group members. If None, will be set to all ranks.
        timeout: Timeout of operations on the group (default 30 minutes).
        backend: The backend name; None means the default group's. Any CPU name
            ``init_process_group`` accepts; all run on rustdist's engine.
        pg_options: Ignored (backend options of torch's backends).
        use_local_synchronization: Only the members synchronize (and call this function);
            non-members get None instead of ``GroupMember.NON_GROUP_MEMBER``.
        group_desc: A string describing the group (logged).
        device_id: None or the CPU device.
        sort_ranks: Order the group ranks by global rank (else as given).

    Returns:
        A handle of the group for collectives; ``GroupMember.NON_GROUP_MEMBER`` on ranks that
        are not members. With torch importable the group is a torch group too (made by
        ``torch.distributed.new_group`` with backend ``"rustdist"``).
    """
    global _group_count, _non_member_ranks
    default = _default()
    if default is None:
        raise ValueError(_NOT_INITIALIZED)
    if not isinstance(default, ProcessGroup):
        raise ValueError(f"The default process group was created by torch.distributed with "
                         f"backend {default.name()!r}: use torch.distributed.new_group")
    name = _backend_name(backend, default._backend, "new_group")
    _check_device_id(device_id)
    timeout = _check_timeout(timeout)
    global_rank, world_size = default._rank, default._size
    if use_local_synchronization and ranks is not None and global_rank not in ranks:
        return None
    if ranks is not None:
        ranks = sorted(ranks) if sort_ranks else list(ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks list must not contain duplicate entries, got {ranks}")
        if len(ranks) > world_size:
            raise ValueError(
                "the new group's world size should be less or equal to the world size set by "
                "init_process_group"
            )
        for r in ranks:
            if r < 0 or r >= world_size:
                raise ValueError(f"Rank {r} is out of range. Valid ranks are 0 to "
                                 f"{world_size - 1} (world_size={world_size})")
    else:
        ranks = list(range(world_size))
    if _torch_world is not None:
        pg = _torch_world.new_group(ranks, timeout, pg_options, use_local_synchronization,
                                    group_desc, sort_ranks)
        if isinstance(pg, ProcessGroup):
            pg._backend = name
        elif pg is not None:
            _non_member_ranks = ranks
        _split_cuda(default, pg, use_local_synchronization)
        return pg
    if use_local_synchronization:
        key = tuple(ranks)
        nth = _local_group_counts.get(key, 0)
        _local_group_counts[key] = nth + 1
        group_name = hashlib.sha1(f"{'_'.join(map(str, ranks))}_{nth}".encode()).hexdigest()
    else:
        _group_count += 1
        group_name = str(_group_count)
    if global_rank not in ranks:
        _non_member_ranks = ranks
        return GroupMember.NON_GROUP_MEMBER
    store = _core.PrefixStore(f"{_store_prefix()}/group/{group_name}", _default_store)
    core = _core.ProcessGroup(store, ranks.index(global_rank), len(ranks),
                              timeout.total_seconds(), group_name)
    pg = ProcessGroup(core, ranks, name, world=False, store=store)
    _subgroups[group_name] = pg
    logger.info("rank %d: created process group %s (ranks %s%s)", global_rank, group_name,
                ranks, f", {group_desc}" if group_desc else "")
    _split_cuda(default, pg, use_local_synchronization)
    return pg


def _split_cuda(parent: ProcessGroup, child: Any, local_sync: bool) -> None:
    """Every rank of the world creates a subgroup together (unless with local
    synchronization): when the world already has an NCCL communicator, the subgroup's is
    split from it (ncclCommSplit, cheaper than a new rendezvous)."""
    if not local_sync and parent._cuda is not None:
        _cuda().new_subgroup(parent, child if isinstance(child, ProcessGroup) else None)


def new_subgroups(group_size: Optional[int] = None, group: Optional[ProcessGroup] = None,
                  timeout: Optional[timedelta] = None, backend: Optional[str] = None,
                  pg_options: Optional[Any] = None,
                  group_desc: Optional[str] = None) -> tuple[Any, list[Any]]:
    """Create subgroups of equal size: ranks ``[0, group_size)``, ``[group_size,
    2 * group_size)``, ... of ``group`` (default: the default group). Every rank calls it.

    Args:
        group_size: The size of each subgroup; required (torch's default, the number of CUDA
            devices, has no meaning here). Must divide the group's size.
        group: The group to split (default: the default group).
        timeout, backend, pg_options, group_desc: As for ``new_group``.

    Returns:
        The subgroup containing the current rank, and all the subgroups used for cleanup.
    """
    if group_size is None:
        raise ValueError(
            "Default group size only takes effect when CUDA is available.If your subgroup "
            "using a backend that does not depend on CUDA,please pass in 'group_size' correctly."
        )
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    world_size = get_world_size(group=group)
    if world_size < group_size:
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the world size "
                         f"({world_size})")
    if world_size % group_size != 0:
        raise ValueError(f"The world size ({world_size}) must be divisible by '{group_size=}'")
    ranks = get_process_group_ranks(group=group)
    return new_subgroups_by_enumeration(
        [ranks[i:i + group_size] for i in range(0, len(ranks), group_size)],
        timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc,
    )


def new_subgroups_by_enumeration(ranks_per_subgroup_list: list[list[int]],
                                 timeout: Optional[timedelta] = None,
                                 backend: Optional[str] = None,
                                 pg_options: Optional[Any] = None,
                                 group_desc: Optional[str] = None) -> tuple[Any, list[Any]]:
    """Create subgroups by enumerating their ranks (disjoint lists). Every rank calls it.

    Args:
        ranks_per_subgroup_list: A list of the ranks of each subgroup.
        timeout, backend, pg_options, group_desc: As for ``new_group``.

    Returns:
        The subgroup containing the current rank (None if none does), and all the subgroups
        (``GroupMember.NON_GROUP_MEMBER`` for those this rank is not in).
    """
    if ranks_per_subgroup_list is None or len(ranks_per_subgroup_list) == 0:
        raise ValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    subgroups = []
    cur_subgroup = None
    seen: dict[int, list[int]] = {}
    my_rank = get_rank()
    for ranks in ranks_per_subgroup_list:
        subgroup = new_group(ranks=ranks, timeout=timeout, backend=backend,
                             pg_options=pg_options, group_desc=group_desc)
        subgroups.append(subgroup)
        for r in ranks:
            if r in seen:
                raise ValueError(f"Rank {r} has appeared in both subgroup {seen[r]} and {ranks}")
            seen[r] = ranks
            if my_rank == r:
                cur_subgroup = subgroup
                logger.info("Rank %s is assigned to subgroup %s", r, ranks)
    return cur_subgroup, subgroups


# ---------------------------------------------------------------------------------------------
# Collectives


def _detail(pg: ProcessGroup, name: str, code: Optional[int], shapes: Optional[list[Any]],
            op: Optional[int] = None, root: Optional[int] = None) -> None:
    """DETAIL debug mode: all ranks must agree on the collective's arguments."""
    _debug.check_collective(pg._pg, pg._ranks, name, code, shapes, op, root)


_cuda_module: Any = None


def _cuda() -> Any:
    """rustdist.cuda, where CUDA tensors go (imported on first use: it imports this module)."""
    global _cuda_module
    if _cuda_module is None:
        from . import cuda

        _cuda_module = cuda
    return _cuda_module


def _cuda_reduce_args(op: Any, tensor: Any, name: str) -> tuple[int, Optional[float]]:
    return _reduce_args(op, _TORCH_CODES[tensor.dtype], name)


_SUM = ReduceOp.SUM


def _reduce_args(op: Any, code: int, name: str) -> tuple[int, Optional[float]]:
    if op is _SUM:  # the default, on the hot path: defined for every dtype
        return 0, None
    opc, premul = op_args(op)
    if code in COMPLEX_CODES and not supports_complex(opc):
        raise ValueError(f"{name} does not support {op} on complex tensors")
    return opc, premul


def _same_dtype(code: int, other: int, t: Any, first: Any) -> None:
    if other != code:
        raise ValueError(
            f"Invalid usage of tensors with different dtypesFound {first.dtype} and  {t.dtype}"
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


def _numel(x: Any) -> int:
    """The element count of a torch tensor or numpy array."""
    return x.numel() if callable(getattr(x, "numel", None)) else x.size


def _check_coalesced_outputs(outputs: list[list[Any]], inputs: list[Any]) -> None:
    """all_gather_coalesced: ``outputs[r][i]`` has the dtype and size of ``inputs[i]`` (gloo's
    checks, RuntimeError), so that every rank sees a wrong output, not only its owner."""
    for i, inp in enumerate(inputs):
        for out in outputs:
            if out[i].dtype != inp.dtype:
                raise RuntimeError(
                    f"all_gather_coalesced: invalid tensor type at index {i} (expected "
                    f"{inp.dtype}, got {out[i].dtype})")
            if _numel(out[i]) != _numel(inp):
                raise RuntimeError(
                    f"all_gather_coalesced: invalid size of output tensor at index {i} "
                    f"(expected length {tuple(inp.shape)}, got {tuple(out[i].shape)})")


def _staged(st: Staged, run: Callable[[list[Any]], Any], outputs: list[Any],
            async_op: bool) -> Optional[Work]:
    """Runs a call whose tensors share memory on ``st.tensors`` (``run`` starts it with
    ``async_op=True`` and returns its Work, or a list of Works) and copies the private buffers
    back into the call's tensors once it has succeeded: CPU ones by the engine before the
    Work completes, CUDA ones on the current stream when the Work is waited for."""
    started = run(st.tensors)
    works = started if isinstance(started, list) else [started]
    if getattr(st.tensors[0], "is_cuda", False):
        return _cuda().staged(works, st.back, outputs, async_op)
    joined = _core.join([w._work for w in works], st.copies(), (st.tensors, outputs))
    return _finish(joined, outputs, async_op)


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("all_reduce")
        return None
    try:
        ptr, n, code = buffer(tensor, "tensor", True)
    except OnCuda:
        opc, premul = _cuda_reduce_args(op, tensor, "all_reduce")
        return _cuda().all_reduce(pg, tensor, opc, premul, async_op)
    except _sparse.SparseInput:  # a sparse COO tensor: summed as gloo sums it, in place
        _sparse.all_reduce(tensor, op, pg._size, partial(all_gather_into_tensor, group=pg),
                           partial(all_gather, group=pg))
        return Work(_core.join([]), [tensor]) if async_op else None
    opc, premul = _reduce_args(op, code, "all_reduce")
    if _debug.detail:
        _detail(pg, "all_reduce", code, [tensor.shape], opc)
    if async_op:
        return Work(pg._pg.all_reduce(ptr, n, code, opc, tensor, premul), [tensor])
    pg._pg.all_reduce(ptr, n, code, opc, None, premul, True)
    return None


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("all_reduce_coalesced")
        return None
    st = unalias(tensors, [UPDATE] * len(tensors))
    if st is not None:  # a tensor listed twice is reduced once, as gloo's flat buffer does
        return _staged(st, lambda ts: all_reduce_coalesced(ts, op, pg, async_op=True), tensors,
                       async_op)
    try:
        bufs = [buffer(t, "tensor", True) for t in tensors]
    except OnCuda:
        # One internal stream runs them in order: the last one's end is the end of all.
        opc, premul = _cuda_reduce_args(op, tensors[0], "all_reduce")
        works = [_cuda().all_reduce(pg, t, opc, premul, True) for t in tensors]
        return _finish_cuda(works, async_op)
    for (_, _, c), t in zip(bufs, tensors):
        _same_dtype(bufs[0][2], c, t, tensors[0])
    if not bufs:
        return Work(_core.join([]), []) if async_op else None
    opc, premul = _reduce_args(op, bufs[0][2], "all_reduce")
    if _debug.detail:
        _detail(pg, "all_reduce_coalesced", bufs[0][2], [t.shape for t in tensors], opc)
    works = [pg._pg.all_reduce(p, n, c, opc, t, premul) for (p, n, c), t in zip(bufs, tensors)]
    return _finish(_core.join(works), tensors, async_op)


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("reduce")
        return None
    root = _peer(pg, dst, group_dst, "reduce", "root")
    try:
        ptr, n, code = buffer(tensor, "tensor", True)
    except OnCuda:
        opc, premul = _cuda_reduce_args(op, tensor, "reduce")
        return _cuda().reduce(pg, tensor, root, opc, premul, async_op)
    opc, premul = _reduce_args(op, code, "reduce")
    if _debug.detail:
        _detail(pg, "reduce", code, [tensor.shape], opc, root)
    work = pg._pg.reduce(ptr, n, code, opc, root, tensor, premul, sync=not async_op)
    return _finish(work, [tensor], async_op)


@exception_logger
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
    try:
        ptr, n, code = buffer(tensor, "tensor", True)
    except OnCuda:
        return _cuda().broadcast(pg, tensor, root, async_op)
    if _debug.detail:
        _detail(pg, "broadcast", code, [tensor.shape], None, root)
    if not async_op:
        pg._pg.broadcast(ptr, n, code, root, None, True)
        return None
    return Work(pg._pg.broadcast(ptr, n, code, root, tensor), [tensor])


def _tensor_list(xs: Any, name: str) -> None:
    if not isinstance(xs, list):
        raise TypeError(
            f"Invalid function argument. Expected parameter `{name}` of type "
            f"List[torch.Tensor] but got {type(xs)} instead."
        )


@exception_logger
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
    _tensor_list(tensor_list, "tensor_list")
    pg = _group(group)
    if pg is None:
        _not_member("all_gather")
        return None
    st = unalias([tensor, *tensor_list], [READ] + [WRITE] * len(tensor_list))
    if st is not None:
        return _staged(st, lambda ts: all_gather(ts[1:], ts[0], pg, async_op=True),
                       tensor_list, async_op)
    try:
        in_ptr, n, code = buffer(tensor, "tensor")
    except OnCuda:
        return _cuda().all_gather(pg, tensor_list, tensor, async_op)
    if len(tensor_list) != pg._size:
        raise RuntimeError(
            f"all_gather: invalid output tensor list at index 0 (expected length {pg._size}, "
            f"got {len(tensor_list)}): `tensor_list` needs one tensor per rank"
        )
    outs = []
    equal = True
    for t in tensor_list:
        p, m, c = buffer(t, "tensor_list", True)
        _same_dtype(code, c, t, tensor)
        equal = equal and m == n
        outs.append((p, m))
    keep = (tensor, *tensor_list)
    if equal:  # every rank's tensor has this rank's size: the all_gather algorithm
        if _debug.detail:
            _detail(pg, "all_gather", code, [tensor.shape])
        work = pg._pg.all_gather(in_ptr, [p for p, _ in outs], n, code, keep,
                                 sync=not async_op)
    else:
        own = outs[pg._rank][1]
        if own != n:
            raise RuntimeError(
                f"all_gather: invalid tensor size at index {pg._rank}: tensor_list[{pg._rank}] "
                f"has {own} elements but this rank's `tensor` has {n} (tensor_list[r] must "
                "have the size of rank r's tensor)"
            )
        if _debug.detail:
            _detail(pg, "all_gather", code, None)
        sends = [(r, in_ptr, n) for r in range(pg._size)]
        recvs = [(r, p, m) for r, (p, m) in enumerate(outs)]
        work = pg._pg.exchange("all_gather", code, 0, sends, recvs, keep, sync=not async_op)
    return _finish(work, tensor_list, async_op)


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("all_gather_coalesced")
        return None
    _tensor_list(input_tensor_list, "input_tensor_list")
    _same_dtypes(input_tensor_list)
    if not isinstance(output_tensor_lists, list):
        raise TypeError("Invalid function argument: output_tensor_lists should be a list")
    for out in output_tensor_lists:
        _tensor_list(out, "output_tensor_lists")
        _same_dtypes(out)
    if len(output_tensor_lists) != pg._size:
        raise RuntimeError(
            "all_gather_coalesced: output lists should be equal to world size "
            f"({len(output_tensor_lists)} lists, world size {pg._size})"
        )
    n = len(input_tensor_list)
    for out in output_tensor_lists:
        if len(out) != n:
            raise RuntimeError("all_gather_coalesced: each output list should have one tensor "
                               f"per input tensor ({len(out)} vs {n})")
    _check_coalesced_outputs(output_tensor_lists, input_tensor_list)
    outs = [t for out in output_tensor_lists for t in out]
    st = unalias([*input_tensor_list, *outs], [READ] * n + [WRITE] * len(outs))
    if st is not None:
        def run(ts: list[Any]) -> Any:
            lists = [ts[n + r * n:n + (r + 1) * n] for r in range(pg._size)]
            return all_gather_coalesced(lists, ts[:n], pg, async_op=True)

        return _staged(st, run, output_tensor_lists, async_op)
    works = [all_gather([out[i] for out in output_tensor_lists], inp, pg, async_op=True)
             for i, inp in enumerate(input_tensor_list)]
    if works and isinstance(works[-1], _cuda_work_type()):
        return _finish_cuda(works, async_op)
    return _finish(_core.join([w._work for w in works if w is not None]), output_tensor_lists,
                   async_op)


@exception_logger
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
    try:
        in_ptr, n, code = buffer(input_tensor, "input_tensor")
    except OnCuda:
        return _cuda().all_gather_into_tensor(pg, output_tensor, input_tensor, async_op)
    out_ptr, m, out_code = buffer(output_tensor, "output_tensor", True)
    if out_code != code or m != pg._size * n:
        _check_pair("all_gather_into_tensor", ("output_tensor", output_tensor, m, out_code),
                    ("input_tensor", input_tensor, n, code), pg._size)
    if _debug.detail:
        _detail(pg, "all_gather_into_tensor", code, [input_tensor.shape])
    if not async_op:
        pg._pg.all_gather(in_ptr, out_ptr, n, code, None, True)
        return None
    work = pg._pg.all_gather(in_ptr, out_ptr, n, code, (input_tensor, output_tensor))
    return Work(work, [output_tensor])


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("reduce_scatter_tensor")
        return None
    try:
        out_ptr, n, code = buffer(output, "output", True)
    except OnCuda:
        opc, premul = _cuda_reduce_args(op, output, "reduce_scatter")
        return _cuda().reduce_scatter_tensor(pg, output, input, opc, premul, async_op)
    in_ptr, m, in_code = buffer(input, "input")
    if in_code != code or m != pg._size * n:
        _check_pair("reduce_scatter_tensor", ("input", input, m, in_code),
                    ("output", output, n, code), pg._size)
    opc, premul = _reduce_args(op, code, "reduce_scatter")
    if _debug.detail:
        _detail(pg, "reduce_scatter_tensor", code, [output.shape], opc)
    if not async_op:
        pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, None, premul, True)
        return None
    work = pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, (input, output), premul)
    return Work(work, [output])


@exception_logger
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
    _tensor_list(input_list, "input_list")
    pg = _group(group)
    if pg is None:
        _not_member("reduce_scatter")
        return None
    try:
        out_ptr, n, code = buffer(output, "output", True)
    except OnCuda:
        opc, premul = _cuda_reduce_args(op, output, "reduce_scatter")
        return _cuda().reduce_scatter(pg, output, input_list, opc, premul, async_op)
    if len(input_list) != pg._size:
        raise RuntimeError(
            f"reduce_scatter: input_list has {len(input_list)} tensors, expected one per rank "
            f"(world size {pg._size})"
        )
    for i, t in enumerate(input_list):
        _, m, c = buffer(t, "input_list")
        _same_dtype(code, c, t, output)
        if m != n:
            raise RuntimeError(f"reduce_scatter: input_list[{i}] has {m} elements but `output` "
                               f"has {n} (every input must have the output's size)")
    opc, premul = _reduce_args(op, code, "reduce_scatter")
    if _debug.detail:
        _detail(pg, "reduce_scatter", code, [output.shape], opc)
    flat = concat(input_list)  # the engine reduces one contiguous input
    in_ptr = buffer(flat, "input_list")[0]
    work = pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, (flat, output), premul,
                                 sync=not async_op)
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


def _pairs_coalesced(name: str, outputs: list[Any], inputs: list[Any], group: ProcessGroup,
                     **kwargs: Any) -> Work:
    """``all_gather_into_tensor`` or ``reduce_scatter_tensor`` (``name``) of each
    ``(outputs[i], inputs[i])`` as one asynchronous call (the torch door's ``*_coalesced``
    methods): every input is read as it was when the call was made, even where an earlier
    pair's output overlaps it."""
    fn = all_gather_into_tensor if name == "all_gather_into_tensor" else reduce_scatter_tensor
    n = len(outputs)
    st = unalias([*outputs, *inputs], [WRITE] * n + [READ] * len(inputs))
    if st is not None:
        return _staged(st, lambda ts: _pairs_coalesced(name, ts[:n], ts[n:], group, **kwargs),
                       outputs, True)
    works = [fn(o, i, group=group, async_op=True, **kwargs) for o, i in zip(outputs, inputs)]
    if works and isinstance(works[-1], _cuda_work_type()):
        return works[-1]  # the internal stream runs them in order
    return Work(_core.join([w._work for w in works if w is not None]), outputs)


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


def _rooted(kind: str, pg: ProcessGroup, root: int, tensor: Any, xs: list[Any], count: int,
            out: bool, sync: bool) -> Any:
    """The exchange of gather (``out=False``: ``tensor`` goes to the root, the root's ``xs``
    receive) or scatter (``out=True``: the root's ``xs`` go out, ``tensor`` receives); None
    once done when ``sync``."""
    ptr, n, code = buffer(tensor, "tensor", out)
    name = "scatter_list" if out else "gather_list"
    peers = []
    for r, t in enumerate(xs):
        p, m, c = buffer(t, name, not out)
        _same_dtype(code, c, t, tensor)
        if count and m != n:
            raise RuntimeError(f"{kind}: invalid tensor size at index {r} ({name}[{r}] has {m} "
                               f"elements but `tensor` has {n})")
        peers.append((r, p, m))
    mine = [(root, ptr, n)]
    sends, recvs = (peers, mine) if out else (mine, peers)
    if _debug.detail:
        _detail(pg, kind, code, [tensor.shape] if count else None, None, root)
    return pg._pg.exchange(kind, code, n if count else 0, sends, recvs, (tensor, *xs), sync=sync)


@exception_logger
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
    if gather_list:
        _tensor_list(gather_list, "gather_list")
    _same_dtypes(tensor, gather_list or [])
    pg = _group(group)
    if pg is None:
        _not_member("gather")
        return None
    if dst is None and group_dst is None:
        dst = 0
    root = _peer(pg, dst, group_dst, "gather", "root")
    xs = _root_list(pg, root, gather_list, "gather_list", "destination")
    st = unalias([tensor, *xs], [READ] + [WRITE] * len(xs))
    if st is not None:
        return _staged(st, lambda ts: gather(ts[0], ts[1:], group=pg, async_op=True,
                                             group_dst=root), xs, async_op)
    try:
        work = _rooted("gather", pg, root, tensor, xs, 1, False, not async_op)
    except OnCuda:
        return _cuda().gather(pg, tensor, xs or None, root, async_op)
    return _finish(work, [xs] if xs else [], async_op)


@exception_logger
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
    if scatter_list:
        _tensor_list(scatter_list, "scatter_list")
    _same_dtypes(tensor, scatter_list or [])
    pg = _group(group)
    if src is None and group_src is None:
        src = 0
    if pg is None:
        _not_member("scatter")
        return None
    root = _peer(pg, src, group_src, "scatter", "root")
    xs = _root_list(pg, root, scatter_list, "scatter_list", "source")
    st = unalias([tensor, *xs], [WRITE] + [READ] * len(xs))
    if st is not None:
        return _staged(st, lambda ts: scatter(ts[0], ts[1:] or None, group=pg, async_op=True,
                                              group_src=root), [tensor], async_op)
    try:
        work = _rooted("scatter", pg, root, tensor, xs, 1, True, not async_op)
    except OnCuda:
        return _cuda().scatter(pg, tensor, xs or None, root, async_op)
    return _finish(work, [tensor], async_op)


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("all_to_all")
        return None
    _tensor_list(output_tensor_list, "output_tensor_list")
    _tensor_list(input_tensor_list, "input_tensor_list")
    for xs, name in ((output_tensor_list, "output_tensor_list"),
                     (input_tensor_list, "input_tensor_list")):
        if len(xs) != pg._size:
            raise RuntimeError(f"all_to_all: {name} has {len(xs)} tensors, expected one per "
                               f"rank (group size {pg._size})")
    size = pg._size
    st = unalias([*input_tensor_list, *output_tensor_list], [READ] * size + [WRITE] * size)
    if st is not None:
        return _staged(st, lambda ts: all_to_all(ts[size:], ts[:size], pg, async_op=True),
                       output_tensor_list, async_op)
    first = input_tensor_list[0] if input_tensor_list else None
    if first is not None and getattr(first, "is_cuda", False):
        return _cuda().all_to_all(pg, output_tensor_list, input_tensor_list, async_op)
    code = -1
    sends, recvs = [], []
    for r, t in enumerate(input_tensor_list):
        p, n, c = buffer(t, "input_tensor_list")
        code = c if code < 0 else code
        _same_dtype(code, c, t, first)
        sends.append((r, p, n))
    for r, t in enumerate(output_tensor_list):
        p, n, c = buffer(t, "output_tensor_list", True)
        _same_dtype(code, c, t, first)
        recvs.append((r, p, n))
    if _debug.detail:
        _detail(pg, "all_to_all", code, None)
    work = pg._pg.exchange("all_to_all", code, 0, sends, recvs,
                           (*input_tensor_list, *output_tensor_list), sync=not async_op)
    return _finish(work, output_tensor_list, async_op)


def _splits(x: Any, n: int, sizes: Optional[list[int]], name: str, size: int) -> list[int]:
    """Element offsets (``size + 1`` of them) of the blocks of ``x`` (``n`` elements) split
    along dim 0: by ``sizes``, or in ``size`` equal blocks when it is None or empty."""
    shape = x.shape
    rows = shape[0] if len(shape) else 1
    if not sizes:
        if rows % size:
            raise RuntimeError(f"all_to_all_single: `{name}`'s dimension 0 ({rows}) must be "
                               f"divisible by the group size {size}")
        block = n // size
        return [r * block for r in range(size + 1)]
    if len(sizes) != size:
        raise RuntimeError(f"all_to_all_single: {name}_split_sizes has {len(sizes)} entries, "
                           f"expected one per rank (group size {size})")
    if sum(sizes) != rows or any(s < 0 for s in sizes):
        raise RuntimeError(f"all_to_all_single: {name}_split_sizes {list(sizes)} must be "
                           f"non-negative and sum to `{name}`'s dimension 0 ({rows})")
    per_row = n // rows if rows else 0
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s * per_row)
    return offsets


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("all_to_all_single")
        return None
    try:
        out_ptr, n_out, code = buffer(output, "output", True)
    except OnCuda:
        return _cuda().all_to_all_single(pg, output, input, output_split_sizes or None,
                                         input_split_sizes or None, async_op)
    in_ptr, n_in, in_code = buffer(input, "input")
    _same_dtype(in_code, code, output, input)
    size = pg._size
    offs_in = _splits(input, n_in, input_split_sizes, "input", size)
    offs_out = _splits(output, n_out, output_split_sizes, "output", size)
    equal = not output_split_sizes and not input_split_sizes
    if _debug.detail:
        _detail(pg, "all_to_all_single", code, [input.shape] if equal else None)
    if equal and offs_in[1] == offs_out[1]:  # blocks of one size: the engine lays them out
        count, sends, recvs = offs_in[1], in_ptr, out_ptr
    else:
        item = ITEMSIZE[code]
        count = 0
        sends = [(r, in_ptr + offs_in[r] * item, offs_in[r + 1] - offs_in[r])
                 for r in range(size)]
        recvs = [(r, out_ptr + offs_out[r] * item, offs_out[r + 1] - offs_out[r])
                 for r in range(size)]
    if not async_op:
        pg._pg.exchange("all_to_all", code, count, sends, recvs, None, True)
        return None
    return Work(pg._pg.exchange("all_to_all", code, count, sends, recvs, (input, output)),
                [output])


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("barrier")
        return None
    if _debug.detail:
        _detail(pg, "barrier", None, None)
    if timeout is None and not async_op:
        pg._pg.barrier(True)
        return None
    work = pg._pg.barrier()
    if async_op:
        return Work(work, [], timeout)
    work.wait(None if timeout is None else _seconds(timeout))
    return None


@exception_logger
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
    pg = _group(group)
    if pg is None:
        _not_member("monitored_barrier")
        return None
    if timeout is None:
        timeout = default_pg_timeout
    elif isinstance(timeout, float):
        warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=3,
        )
        timeout = timedelta(seconds=timeout)
    timeout = _check_timeout(timeout)
    pg._pg.monitored_barrier(timeout.total_seconds(), wait_all_ranks).wait()
    return None


# ---------------------------------------------------------------------------------------------
# Point-to-point


def _send_work(tensor: Any, dst: Optional[int], group: Optional[ProcessGroup], tag: int,
               group_dst: Optional[int], op: str) -> Optional[Work]:
    pg = _group(group)
    if pg is None:
        _not_member(op)
        return None
    peer = _peer(pg, dst, group_dst, op, "destination")
    if op == "send" and peer == pg._rank:  # torch forbids a blocking send to self
        raise ValueError(
            "Invalid destination rank: destination rank should not be the same as "
            "the rank of the current process."
        )
    try:
        ptr, n, code = buffer(tensor, "tensor")
    except OnCuda:
        return _cuda().isend(pg, tensor, peer, tag)
    return Work(pg._pg.send(ptr, n, code, peer, tag, tensor), [tensor])


_SELF_SOURCE = ("Invalid source rank: source rank should not be the same as the rank of the "
                "current process.")


def _recv_work(tensor: Any, src: Optional[int], group: Optional[ProcessGroup], tag: int,
               group_src: Optional[int], op: str) -> tuple[Optional[ProcessGroup], Any]:
    """The group and the Work of a receive (None, None on a non-member)."""
    pg = _group(group)
    if pg is None:
        _not_member(op)
        return None, None
    peer = None if src is None and group_src is None else _peer(pg, src, group_src, op, "source")
    try:
        ptr, n, code = buffer(tensor, "tensor", True)
    except OnCuda:
        return pg, _cuda().irecv(pg, tensor, peer, tag)
    return pg, Work(pg._pg.recv(ptr, n, code, peer, tag, tensor), [tensor])


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
    return _send_work(tensor, dst, group, tag, group_dst, "isend")


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
    return _recv_work(tensor, src, group, tag, group_src, "irecv")[1]


@exception_logger
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


@exception_logger
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
        if isinstance(work, _cuda_work_type()):
            work._synchronize_host()  # the sender is known once the data has arrived
        group_src = work.source_rank()
        if group_src == pg._rank:
            raise ValueError(_SELF_SOURCE)
    return pg._global_rank(group_src)


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
        buffer(tensor, "tensor")
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
    if _TorchFuture is not None:
        import torch.distributed as td

        if op is td.isend:
            return "send"
        if op is td.irecv:
            return "recv"
    return None


@exception_logger
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
    sends = [_p2p_kind(p.op) == "send" for p in p2p_op_list]
    st = unalias([p.tensor for p in p2p_op_list], [READ if s else WRITE for s in sends])
    if st is not None and _group(grp) is not None:
        def run(ts: list[Any]) -> list[Work]:
            return batch_isend_irecv([P2POp(isend if send else irecv, t, group=p.group, tag=p.tag,
                                            group_peer=p.group_peer)
                                      for send, t, p in zip(sends, ts, p2p_op_list)])

        # Every request stands for the whole batch: the copies back need all of it done.
        done = _staged(st, run, [p.tensor for p in p2p_op_list], True)
        return [done] * len(p2p_op_list)
    if getattr(p2p_op_list[0].tensor, "is_cuda", False):
        pg = _group(grp)
        if pg is None:
            return []
        # One NCCL group call for them all (ncclGroupStart/End), as torch's NCCL does.
        return _cuda().batch_isend_irecv(
            pg, [(_p2p_kind(p.op) == "send", p.tensor, p.group_peer, p.tag) for p in p2p_op_list])
    reqs = []
    for p in p2p_op_list:
        if _p2p_kind(p.op) == "send":
            work = isend(p.tensor, group=p.group, tag=p.tag, group_dst=p.group_peer)
        else:
            work = irecv(p.tensor, group=p.group, tag=p.tag, group_src=p.group_peer)
        if work is not None:
            reqs.append(work)
    return reqs


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


def _fast_paths() -> None:
    """The hot collectives' usual calls (a plain contiguous CPU tensor, SUM, a rustdist group,
    synchronous, no DETAIL checks) skip this layer through ``_core.fast_function``, builtins
    that hand every other call to the functions above. A builtin carries its function's
    docstring and signature; where a default is not a literal (``op=ReduceOp.SUM``) a function
    with the same parameters stands in front and passes its arguments on by position."""
    if _Tensor is None:  # numpy arrays take the functions above
        return
    _core.fast_init(_Tensor, dict(REAL_TORCH_CODES), ReduceOp.SUM, ReduceOp, sys.modules[__name__],
                    ProcessGroup, _debug, _debug.log_failure)
    names = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
             "all_to_all_single", "barrier")
    fast = {}
    for name in names:
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
    # The torch front door: the group methods torch's synchronous calls reach become Python
    # methods with the same parameters that pass them on to a fast builtin (a Python function,
    # so that pybind11 takes it for an override when torch's C++ calls the group).
    # Aliases (all_gather_single, ...) are whatever names the class binds
    # to the same function.
    for name in ("allreduce", "broadcast", "_allgather_base", "_reduce_scatter_base", "barrier"):
        python = GroupBase.__dict__[name]
        builtin = _core.fast_function(name, python, __name__, python.__doc__ or "", method=True)
        method = _debug.compiled_like(python, "    return fast({call})\n", {"fast": builtin})
        for attr in [a for a, v in vars(GroupBase).items() if v is python]:
            setattr(GroupBase, attr, method)


_fast_paths()


__all__ = [
    "Backend", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "Work", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_single", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "broadcast", "default_pg_timeout", "destroy_process_group", "gather", "get_backend",
    "get_global_rank", "get_group_rank", "get_node_local_rank", "get_process_group_ranks",
    "get_rank",
    "get_world_size", "group", "init_process_group", "irecv", "is_available", "is_initialized",
    "isend", "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "recv", "reduce", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
    "scatter", "send",
]
