"""rustdist as torchft's reconfigurable process group: :class:`ProcessGroupRustdist`.

torchft (``pip install torchft``) keeps training going while replica groups fail and come
back: its ``Manager`` reconfigures the process group that joins the replica groups on every
quorum change (``ProcessGroup.configure``), aborts it on error and reads ``errored()`` before
each commit. :class:`ProcessGroupRustdist` is that process group over rustdist's engine, a
drop-in for torchft's ``ProcessGroupGloo``::

    from rustdist.torchft import ProcessGroupRustdist
    manager = torchft.Manager(pg=ProcessGroupRustdist(timeout=timedelta(seconds=10)), ...)

Beyond gloo it has reduce_scatter, reduce_scatter_tensor_coalesced and alltoall_base, and an
``abort()`` from any thread fails the collectives blocked on every thread of the rank within
milliseconds (the engine polls every 20 ms) and tells the peers, so no subprocess (torchft's
``ProcessGroupBaby*``) is needed to get out of a stuck collective.

Importing this module needs torchft (ImportError otherwise).
"""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta
from typing import Any, Optional

import torch
from torch.distributed import Store
from torch.distributed.distributed_c10d import Work
from torch.futures import Future
from torchft.process_group import ProcessGroupWrapper

from ._errors import DistBackendError
from ._group import ProcessGroup as _Group
from ._torch_backend import new_process_group

#: The backend name torchft and torch's registry see (``getBackendName``).
BACKEND_NAME = "torchft-rustdist"


class _Work(Work):
    """A rustdist group's Work as torchft's Manager needs it (``_ManagedWork`` wraps it).

    * ``wait()`` returns once the operation has finished, also when it failed: the error
      goes to the future (where torchft's Manager reports it and skips the step) and to
      ``errored()``. torchft's DDP comm hook (torchft 0.2.0) asserts when ``wait()`` raises,
      which would end the training of every surviving replica when a peer dies mid-allreduce
      (as it does on torchft's gloo groups).
    * ``get_future()`` after ``wait()`` returns a complete future, as gloo's does:
      ``_ManagedWork`` chains its callbacks on it right after ``wait()`` and they read a loop
      variable, so they must run inline; rustdist's own future completes on a thread of
      torch's a moment after the operation."""

    def __init__(self, work: Work) -> None:
        super().__init__()
        self._work = work

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until the operation completes (torch's ``Work.wait``) and returns True;
        a failed operation's outputs are undefined (its error: :meth:`exception`, the
        future, the group's ``errored()``). Raises when ``timeout`` passes first."""
        try:
            self._work.wait(timeout)
        except Exception:  # noqa: BLE001 - kept by the Work; only a timeout is raised
            if not self._work.is_completed():
                raise
        return True

    def get_future(self) -> Future:
        """A future of the output tensors (torch's ``Work.get_future``), typed
        ``List[Tensor]``: complete on return once the operation has finished."""
        fut = self._work.get_future()
        if self._work.is_completed():
            with contextlib.suppress(Exception):  # the future holds the error
                fut.wait()
        return fut

    def is_completed(self) -> bool:
        """Whether the operation has finished."""
        return self._work.is_completed()

    def is_success(self) -> bool:
        """Whether the operation has finished successfully."""
        return self._work.is_success()

    def exception(self) -> Optional[BaseException]:
        """The operation's error, or None."""
        return self._work.exception()

    def result(self) -> list[torch.Tensor]:
        """The output tensors."""
        return self._work.result()

    def source_rank(self) -> int:
        """The sender's group rank, for a completed receive from any source."""
        return self._work.source_rank()

    _source_rank = source_rank


class ProcessGroupRustdist(ProcessGroupWrapper):
    """A reconfigurable process group on rustdist's engine (torchft's ``ProcessGroup``).

    Each ``configure`` aborts and releases the previous incarnation, then builds a rustdist
    group of ``world_size`` ranks over the store prefix it is given (torchft gives every
    quorum a fresh one). The collectives pass through to that group (torchft's
    ``ProcessGroupWrapper``): allreduce, allreduce_coalesced, allgather,
    allgather_into_tensor_coalesced, broadcast, barrier, reduce_scatter,
    reduce_scatter_tensor_coalesced, alltoall_base, send and recv (CPU tensors; CUDA ones go
    to rustdist's NCCL path as on any rustdist group, untested under torchft). Their Works
    do not raise from ``wait()``: see ``errored()``.

    Args:
        timeout: timeout of the store connection, of building the group and of its
            collectives (torchft: "timeout for reconfiguration for TCPStore").
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        # abort()'s error, until the next configure: the aborted group is gone by then.
        self._aborted: Optional[Exception] = None
        # abort() and shutdown() may come from different threads: one releases the group.
        self._lock = threading.Lock()
        self._store_addr = ""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """The backend's name, ``"torchft-rustdist"``."""
        return BACKEND_NAME

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: Optional[int] = None, group_rank: Optional[int] = None,
                  group_world_size: Optional[int] = None,
                  global_ranks: Optional[list[int]] = None) -> None:
        """Reconfigures the group for a new quorum (torchft: "reconfigures the ProcessGroup to
        use a new store, rank and world size"): the previous incarnation is aborted (its
        pending operations fail, its peers are told) and released, then a rustdist group of
        ``world_size`` ranks is built over ``store_addr`` (``host:port/prefix``, unique per
        call), this process being ``rank``. Blocks until every rank has joined; raises when
        that takes longer than the timeout.

        ``replica_id``, ``group_rank`` and ``group_world_size`` are torchft's bookkeeping;
        ``quorum_id`` and ``store_addr`` name the group; ``global_ranks`` (the members'
        global ranks, by rank) are the group's ranks when they are ``world_size`` distinct
        numbers."""
        self._store_addr = store_addr
        super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank,
                          group_world_size, global_ranks)
        self._aborted = None

    def _create_pg(self, store: Store, rank: int, world_size: int) -> _Group:
        """The rustdist group of this quorum over ``store`` (torchft's prefixed store)."""
        ranks = self._global_ranks
        if not ranks or len(set(ranks)) != world_size:
            ranks = list(range(world_size))
        # Every member must give the same name, and it must differ from the previous
        # quorum's (the engine tells groups apart by a hash of it): the quorum id and the
        # store address (unique per configure, torchft's contract) are both.
        name = f"{BACKEND_NAME}/{self._quorum_id}/{self._store_addr}"
        return new_process_group(store, rank, world_size, self._timeout, name, ranks)

    def _wrap_work(self, work: Optional[Work], opts: Any) -> Optional[Work]:
        """The Work handed to torchft and torch (None for a synchronous call of torch's
        Python API, which has already finished)."""
        return None if work is None else _Work(work)

    def abort(self, errored: bool = True) -> None:
        """Aborts the group (torchft: "aborts the process group"): every pending and
        in-progress operation, on whichever thread, fails within milliseconds with
        ``DistBackendError``, the peers' operations on the group fail too, and the group is
        released. Until the next ``configure``, :meth:`errored` reports the abort when
        ``errored`` is true (torchft passes False when it reconfigures)."""
        with self._lock:
            pg = self._pg
            super().abort(errored=errored)
            if errored:
                self._aborted = DistBackendError(
                    "the process group was aborted: abort() was called")
        if isinstance(pg, _Group):
            pg._shutdown()  # after abort: nothing is left to wait for

    def shutdown(self) -> None:
        """Leaves the group cleanly and releases it (torchft: "shuts down the process
        group"); ``configure`` may be called again afterwards."""
        with self._lock:
            pg, self._pg = self._pg, None
        if isinstance(pg, _Group):
            pg._shutdown()

    def errored(self) -> Optional[Exception]:
        """Whether an async error occurred that requires reconfiguration (torchft): None while
        the group works, else a RuntimeError (``DistBackendError`` or ``DistNetworkError``,
        the failure's class) saying the process group was aborted and why. A rustdist group
        that failed (a peer died or left, a timeout, an abort) fails every later operation
        and its peers are told, so it is aborted in effect."""
        if self._aborted is not None:
            return self._aborted
        pg = self._pg
        cause = pg._pg.error() if isinstance(pg, _Group) else None
        if cause is None:
            return None
        cls = type(cause) if isinstance(cause, RuntimeError) else DistBackendError
        err = cls(f"the process group was aborted after an error: {cause}")
        err.__cause__ = cause
        return err

    def set_timeout(self, timeout: timedelta) -> None:
        """Sets the default timeout (torchft): of the next ``configure`` and of the live
        group's operations issued from now on."""
        super().set_timeout(timeout)
        pg = self._pg
        if isinstance(pg, _Group):
            pg._set_default_timeout(timeout)


__all__ = ["BACKEND_NAME", "ProcessGroupRustdist"]
