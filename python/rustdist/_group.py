"""``ProcessGroup``: the engine's group (``_core.ProcessGroup``) with its members' global ranks,
its timeout, abort and shutdown. With torch importable it is a ``torch.distributed``
``ProcessGroup`` subclass; the torch front door (``_torch_backend``) adds the methods torch
calls on a backend."""

from __future__ import annotations

import weakref
from datetime import timedelta
from typing import Any, Callable, Optional

from . import _core, cuda
from ._tracing import not_traced

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch.distributed as _td

    _GroupBase: Any = _td.ProcessGroup
except ImportError:
    _GroupBase = object

#: The backend's name, in torch's registry (``_torch_backend.register``, which ``import
#: rustdist`` runs) and in rustdist's world.
BACKEND_NAME = "rustdist"

#: Default timeout of process groups (torch's ``default_pg_timeout``).
default_pg_timeout: timedelta = timedelta(minutes=30)

#: The groups torch created through the "rustdist" backend, shut down by rustdist's
#: destroy_process_group (torch before 2.7 does not call a Python group's shutdown).
made_by_torch: weakref.WeakSet = weakref.WeakSet()


#: ``shrink_group``'s flags, as torch has them: fail when operations are pending, or abort them.
SHRINK_DEFAULT = 0
SHRINK_ABORT = 1


def check_shrink_args(ranks_to_exclude: Any, shrink_flags: Any, pg: ProcessGroup) -> list[int]:
    """torch's checks of ``shrink_group``'s arguments, with its errors; the sorted ranks."""
    if not isinstance(ranks_to_exclude, list):
        raise TypeError(
            f"ranks_to_exclude must be a list, but got {type(ranks_to_exclude).__name__}. "
            "Example: [1, 3, 5] to exclude ranks 1, 3, and 5."
        )
    if not ranks_to_exclude:
        raise ValueError(
            "ranks_to_exclude cannot be empty. To shrink a group, you must specify at least "
            "one rank to exclude. Example: [failed_rank_id]"
        )
    if not isinstance(shrink_flags, int) or shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(
            f"Invalid shrink_flags value: {shrink_flags}. Must be one of: SHRINK_DEFAULT "
            f"({SHRINK_DEFAULT}) or SHRINK_ABORT ({SHRINK_ABORT}). Use SHRINK_ABORT to abort "
            "ongoing operations before shrinking."
        )
    size = pg._size
    if size <= 1:
        raise ValueError(f"Cannot shrink a process group with size {size}. Group must have at "
                         "least 2 ranks to support shrinking.")
    seen: set[int] = set()
    for i, r in enumerate(ranks_to_exclude):
        if not isinstance(r, int):
            raise TypeError("All elements in ranks_to_exclude must be integers. Element at "
                            f"index {i} is {type(r).__name__}: {r}")
        if not 0 <= r < size:
            raise ValueError(f"Rank {r} at index {i} is out of bounds for group size {size}. "
                             f"Valid ranks are in range [0, {size - 1}].")
        if r in seen:
            raise ValueError(f"Duplicate rank {r} found in ranks_to_exclude at index {i}. "
                             "Each rank can only be excluded once.")
        seen.add(r)
    if len(seen) >= size:
        raise ValueError(f"Cannot exclude all {size} ranks from process group. At least one "
                         f"rank must remain. Excluding {len(seen)} ranks.")
    if pg._rank in seen:
        raise RuntimeError(
            f"Current rank {pg._rank} is in the exclusion list and should not call "
            "shrink_group(). Only non-excluded ranks should participate in the shrinking "
            "operation. Excluded ranks should terminate their processes instead."
        )
    return sorted(seen)


class ProcessGroup(_GroupBase):  # type: ignore[misc, valid-type]
    """A process group: the engine's group (``_core.ProcessGroup``, ``_pg``) plus the global
    ranks of its members ordered by group rank (``_ranks``). Pass it as ``group=`` to any
    collective."""

    def __init__(self, pg: Any, ranks: list[int], backend: str, world: bool, store: Any) -> None:
        if _GroupBase is object:
            super().__init__()
        else:  # torch's (store, rank, size) constructor fails for Python subclasses
            super().__init__(pg.rank, pg.size)
        self._pg = pg
        # The group's store (its CUDA group rendezvous there) and that CUDA group, made by
        # rustdist.cuda on the first CUDA tensor.
        self._store = store
        self._cuda: Any = None
        self._ranks = ranks
        # global -> group rank; None on the default group, where both are the same (torch's
        # rule for WORLD, also once a shrink has left it fewer ranks than the world had)
        self._group_ranks: Optional[dict[int, int]] = (
            None if world else {g: i for i, g in enumerate(ranks)}
        )
        self._rank: int = pg.rank
        self._size: int = pg.size
        self._backend = backend
        # Called with the group when it ends (shut down, or aborted in torch's world): set by
        # the world that caches it as the default group.
        self._on_end: Optional[Callable[[ProcessGroup], None]] = None
        # How the flight recorder names the group: torch's group_name and group_desc.
        self._trace: tuple[str, str] = (pg.group_name, "default_pg" if world else "undefined")
        _core.flight_recorder_set_rank(ranks[pg.rank])
        self._trace_as(*self._trace)

    def _trace_as(self, name: str, desc: str) -> None:
        """Names the group in the flight recorder (its dumps, and the timeouts that quote
        what a rank was doing) as torch knows it: ``name`` (torch's ``group_name``) and
        ``desc`` (``group_desc``)."""
        self._trace = (name, desc)
        self._pg.set_trace_info(name, desc, self._ranks)
        if self._cuda is not None:
            self._cuda.set_trace_info(name, desc, self._ranks)

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
    def options(self) -> _Options:
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
        return group_rank if self._group_ranks is None else self._ranks[group_rank]

    def _shrunk(self, excluded: list[int], abort_pending: bool) -> ProcessGroup:
        """The group of this group's ranks but ``excluded`` (sorted group ranks), renumbered in
        order, of this group's class, over this group's links and store (torch's backend
        ``shrink``; every other member calls it too); its members keep their global ranks.
        ``abort_pending`` (``SHRINK_ABORT``) aborts this group's pending operations first;
        without it pending work raises, unless the group has failed. This group refuses work
        afterwards. A CUDA group is shrunk with it (``ncclCommShrink``)."""
        if self._cuda is not None:
            cuda.check_shrink(self)  # before anything changes: NCCL may not have it
        core = self._pg.shrink(excluded, abort_pending)
        out = set(excluded)
        ranks = [g for i, g in enumerate(self._ranks) if i not in out]
        group = type(self)(core, ranks, self._backend, world=False, store=self._store)
        group._trace_as(core.group_name, self._trace[1])
        if self._cuda is not None:
            cuda.shrink(self, group, excluded, abort_pending)
        return group

    def _shutdown(self) -> None:
        """Leaves the engine group and its CUDA group (queued work still runs)."""
        self._ended()
        if self._cuda is not None:
            cuda.shutdown(self)
        self._pg.shutdown()

    @not_traced
    def abort(self) -> None:
        """abort all operations and connections if supported by the backend

        Every queued and in-progress operation of the group (CPU and CUDA), whichever thread
        started or waits on it, fails within milliseconds with DistBackendError saying the
        group was aborted, and so does every later one; the peers are told, so that their
        pending and later operations on the group fail the same way. The group stays
        registered (torch's semantics): ``_abort_process_group`` or
        ``destroy_process_group`` forgets it. The flight recorder is dumped
        (``TORCH_FR_DUMP_TEMP_FILE``; see ``rustdist.flight_recorder``).
        """
        self._ended()
        if self._cuda is not None:
            cuda.abort(self)
        self._pg.abort()
        _core.flight_recorder_dump_after(f"process group {self._trace[0]} aborted")

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(self)

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


__all__ = ["BACKEND_NAME", "SHRINK_ABORT", "SHRINK_DEFAULT", "ProcessGroup", "check_shrink_args",
           "default_pg_timeout", "made_by_torch"]
