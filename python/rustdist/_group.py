"""``ProcessGroup``: the engine's group (``_core.ProcessGroup``) with its members' global ranks,
its timeout, abort and shutdown, the reconfigure API (``_reconfigure``), its collective and
abort hooks (``_hooks``) and its error state. With torch importable it is a
``torch.distributed`` ``ProcessGroup`` subclass; the torch front door (``_torch_backend``)
adds the methods torch calls on a backend."""

from __future__ import annotations

import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Optional

from . import _core, _reconfigure, _window, cuda, status
from ._debug import logger
from ._errors import DistNetworkError, ErrorType
from ._hooks import Hooks, check_hook
from ._tracing import not_traced
from ._work import Work

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


#: Every group of this process, so that reconfiguring the default group can invalidate the
#: groups made from its old membership.
_live: weakref.WeakSet = weakref.WeakSet()


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

    #: The registered collective hooks, None while there are none (read on every operation).
    _hooks: Optional[Hooks] = None

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
        # Whether this is a world's default group (its ranks are global ranks).
        self._is_world = world
        # Called with the group when it ends (shut down, or aborted in torch's world): set by
        # the world that caches it as the default group.
        self._on_end: Optional[Callable[[ProcessGroup], None]] = None
        # How the flight recorder names the group: torch's group_name and group_desc.
        self._trace: tuple[str, str] = (pg.group_name, "default_pg" if world else "undefined")
        self._uuid = -1  # the reconfigure that made the current engine group, if one did
        _core.flight_recorder_set_rank(ranks[pg.rank])
        self._trace_as(*self._trace)
        # The reconfigure API: the engine group's first name (re-formed groups are named
        # after it), this process's first global rank and the token of its handle, and the
        # uuids it took part in.
        self._base_name: str = pg.group_name
        self._stable_rank: int = ranks[pg.rank]
        self._token = _reconfigure.new_token()
        self._uuids: set[int] = set()
        # The members' handle tokens by rank, known after a reconfigure (a later one that only
        # leaves members out shrinks the group over its links).
        self._member_tokens: Optional[list[str]] = None
        self._hook_registry = Hooks()
        # Abort hooks by id; whether they ran for the current engine group; the thread that
        # waits for the engine group to fail, while there are hooks; a local abort.
        self._abort_hooks: dict[int, Callable[[], Any]] = {}
        self._abort_lock = threading.Lock()
        self._abort_fired = False
        self._abort_watcher: Optional[threading.Thread] = None
        self._core_moved = threading.Event()
        self._aborted = False
        self._is_ended = False
        _live.add(self)

    def _trace_as(self, name: str, desc: str) -> None:
        """Names the group in the flight recorder (its dumps, and the timeouts that quote
        what a rank was doing) as torch knows it: ``name`` (torch's ``group_name``) and
        ``desc`` (``group_desc``)."""
        self._trace = (name, desc)
        # A re-formed group says which reconfigure made it (its dumps, status queries).
        made_by = f"{desc} (reconfigure uuid {self._uuid})" if self._uuid >= 0 else desc
        self._pg.set_trace_info(name, made_by, self._ranks)
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
        """The group's name (its first engine group's: a reconfigure keeps it)."""
        return self._base_name

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

    # -- reconfigure (torch 2.14's fault-tolerance API) -------------------------------------

    @property
    def supports_reconfigure(self) -> bool:
        """Whether the group can be re-formed over a new set of peers (``reconfigure``):
        always, for a rustdist CPU group (``enable_reconfigure`` is accepted; a rustdist group
        works from its creation on, with or without it)."""
        return self._cuda is None

    def get_reconfigure_handle(self) -> str:
        """An opaque handle of this process's group that peers pass to :meth:`reconfigure`
        (``torch.distributed._get_reconfigure_handle``): it names the process and the store
        its group is on, and stays the same across reconfigures. Data, not a credential:
        joining still takes the store and, where set, the links' key or TLS."""
        return _reconfigure.make_handle(self._stable_rank, self._token, self._store)

    @not_traced
    def reconfigure(self, opts: Any) -> Work:
        """Re-forms the group over ``opts.handles`` (torch's ``ReconfigureOptions``: one
        handle per member, from :meth:`get_reconfigure_handle`; a list fixes the new ranks by
        position, a set lets rustdist order them), under ``opts.uuid``, which may be used
        once; within ``opts.timeout`` (default: the group's timeout), a member that never
        comes named in the error. Every member calls it, also processes that were not in
        the group (a replacement, another group being merged). The same group object then
        has the new rank and size; pending operations on the old membership fail, and so
        does every group made from it before (make them again). ``opts.hints`` is accepted
        and ignored. Returns a completed Work: the group is ready on every member."""
        uuid, handles, timeout = _reconfigure.options(opts)
        if self._cuda is not None:
            raise RuntimeError("reconfigure: this group has run CUDA operations (NCCL), which "
                               "rustdist cannot re-form yet; reconfigure a CPU group")
        if uuid in self._uuids:
            raise _reconfigure.uuid_used(uuid)
        members = _reconfigure.ordered(handles)
        rank = _reconfigure.position(members, self.get_reconfigure_handle())
        keep_timeout = self._pg.timeout
        if timeout is None:
            timeout = timedelta(seconds=keep_timeout)
        self._uuids.add(uuid)
        leave_out = _reconfigure.excluded(self._member_tokens, members)
        # A failed group (a peer died) shrinks over the survivors' links, with no store; a
        # working one goes through a rendezvous, which leaves the memory of the members it
        # leaves out alone (they may still be finishing their last operation).
        if leave_out is not None and self._pg.error() is not None:
            self._pg.set_timeout(timeout.total_seconds())
            core = self._pg.shrink(leave_out, True)
        else:
            core = _reconfigure.form(self._store, self._base_name, uuid, members, rank, timeout)
        core.set_timeout(keep_timeout)
        self._member_tokens = [_reconfigure.parse_handle(h)[1] for h in members]
        stable = [_reconfigure.parse_handle(h)[0] for h in members]
        self._replace_core(core, rank, stable, uuid)
        return Work(_core.join([]), [])

    def _replace_core(self, core: Any, rank: int, stable_ranks: list[int], uuid: int) -> None:
        """This group runs on ``core`` (a re-formed engine group, this process its ``rank``)
        from now on; the old engine group is retired."""
        old = self._pg
        core.set_hooked(bool(self._hooks))
        self._pg, self._rank, self._size, self._uuid = core, rank, core.size, uuid
        # The default group's ranks are global ranks (torch's WORLD); another group's members
        # keep the global ranks they first had.
        self._ranks = list(range(core.size)) if self._is_world else stable_ranks
        if self._group_ranks is not None:
            self._group_ranks = {g: i for i, g in enumerate(self._ranks)}
        with self._abort_lock:
            self._abort_fired = self._aborted = self._is_ended = False
        self._move_on()
        self._start_abort_watcher()
        _core.flight_recorder_set_rank(self._ranks[rank])
        name, desc = self._trace
        self._trace_as(name, desc)
        old.retire(f"process group {name} was reconfigured (uuid {uuid}): its operations on "
                   "the old membership were cancelled")
        if not self._is_world:
            return
        try:
            status.publish(self._store, rank, core.size, core.status_address)
        except RuntimeError as e:  # a shrink needs no store: the one whose rank died is gone
            logger.info("rank %d: the re-formed world is not published for status queries: "
                        "%s", rank, e)
        # The groups made from this world are on its store (torchft's, say, are not).
        store = _reconfigure.store_address(self._store)
        for other in list(_live):
            if (other is not self and not other._is_ended and store
                    and _reconfigure.store_address(other._store) == store):
                other._pg.retire(
                    f"process group {other._trace[0]} was made before the default group was "
                    f"reconfigured (uuid {uuid}) and is no longer valid: make it again (new_group) "
                    "over the new membership")

    # -- abort hooks and the error state ---------------------------------------------------

    @property
    def supports_abort_hooks(self) -> bool:
        """Abort hooks are supported (:meth:`register_abort_hook`)."""
        return True

    @property
    def supports_completion_hooks(self) -> bool:
        """Completion hooks are not supported (as on gloo)."""
        return False

    @property
    def supports_window(self) -> bool:
        """Whether one-sided windows (``new_window``) work on the group: always (UNIFIED
        access where all its ranks share one host with shared memory, SEPARATE elsewhere)."""
        return bool(self._pg.supports_window)

    def new_window(self, tensor: Any = None) -> _window.Window:
        """Creates a one-sided communication window on the group (collective: every rank,
        in the same order); ``tensor``, if given, is registered with it."""
        return _window.Window(self, tensor)

    def register_abort_hook(self, hook_id: int, hook: Callable[[], Any]) -> None:
        """Calls ``hook()`` once when the group is aborted (:meth:`abort`, before it aborts),
        times out or fails (a dead peer, a peer's abort): on the thread that aborts, else on
        a watcher thread. Replaces the hook of the same ``hook_id``. Once per engine group:
        a reconfigured group calls its hooks again on its next failure."""
        self._abort_hooks[check_hook(hook_id, hook)] = hook
        self._start_abort_watcher()

    def unregister_abort_hook(self, hook_id: int) -> None:
        """Removes the abort hook ``hook_id`` (none registered under it: nothing happens)."""
        self._abort_hooks.pop(hook_id, None)

    def _fire_abort_hooks(self, core: Any) -> None:
        """Calls the abort hooks, once for the engine group ``core``, in id order."""
        with self._abort_lock:
            if self._abort_fired or core is not self._pg:
                return
            self._abort_fired = True
            hooks = [self._abort_hooks[k] for k in sorted(self._abort_hooks)]
        for hook in hooks:
            hook()

    def _watch_failure(self) -> None:
        """Waits for the engine group to fail while abort hooks are registered and the group
        lives, and calls them when it does; then waits for a reconfigure to give the group a
        new engine group (the one it retires is no failure) or for the group to end."""
        while self._abort_hooks and not self._is_ended:
            core, moved = self._pg, self._core_moved
            if core.wait_failed(0.25) is None:
                continue
            self._fire_abort_hooks(core)
            moved.wait()

    def _start_abort_watcher(self) -> None:
        if self._abort_hooks and (self._abort_watcher is None
                                  or not self._abort_watcher.is_alive()):
            self._abort_watcher = threading.Thread(target=self._watch_failure, daemon=True,
                                                   name=f"rustdist-abort-hooks-{self._rank}")
            self._abort_watcher.start()

    def _move_on(self) -> None:
        """Wakes the abort watcher: the group has a new engine group, or has ended."""
        moved, self._core_moved = self._core_moved, threading.Event()
        moved.set()

    def get_error(self) -> Any:
        """What failed the group, as torch's ``ErrorType``: SUCCESS while it works (and after
        this process's own :meth:`abort`, as on gloo), TIMEOUT after an operation timed out,
        REMOTE_ERROR when a peer died, hung up or aborted, COMM_ERROR for any other failure
        (ranks that disagreed about a collective)."""
        error = self._pg.error()
        if error is None or self._aborted:
            return ErrorType.SUCCESS
        text = str(error).lower()
        if "timed out" in text:
            return ErrorType.TIMEOUT
        if isinstance(error, DistNetworkError) or "aborted" in text:
            return ErrorType.REMOTE_ERROR
        return ErrorType.COMM_ERROR

    # -- collective hooks -------------------------------------------------------------------

    def register_pre_hook(self, hook_id: int, hook: Callable[[Any], Any]) -> None:
        """Calls ``hook(args)`` (``PreHookArgs``: ``name``, ``async_op``, ``input_tensors``,
        ``output_tensors``, ``root``, ``op_id``) before every collective and point-to-point
        operation issued on the group, in ``hook_id`` order; replaces the hook of the same
        id."""
        self._hook_registry.pre[check_hook(hook_id, hook)] = hook
        self._sync_hooks()

    def unregister_pre_hook(self, hook_id: int) -> None:
        """Removes the pre-hook ``hook_id``."""
        self._hook_registry.pre.pop(hook_id, None)
        self._sync_hooks()

    def register_post_hook(self, hook_id: int, hook: Callable[[Any], Any]) -> None:
        """Calls ``hook(args)`` (``PostHookArgs``: ``name``, ``async_op``, ``work``,
        ``op_id``, the pre-hook's) once each operation is issued (a synchronous one: done),
        in ``hook_id`` order; replaces the hook of the same id."""
        self._hook_registry.post[check_hook(hook_id, hook)] = hook
        self._sync_hooks()

    def unregister_post_hook(self, hook_id: int) -> None:
        """Removes the post-hook ``hook_id``."""
        self._hook_registry.post.pop(hook_id, None)
        self._sync_hooks()

    def _sync_hooks(self) -> None:
        """Whether operations fire hooks: the Python path reads ``_hooks``, the fast path the
        engine group's flag (it hands hooked groups' calls to Python)."""
        hooked = bool(self._hook_registry)
        self._hooks = self._hook_registry if hooked else None
        self._pg.set_hooked(hooked)

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
        self._fire_abort_hooks(self._pg)
        self._aborted = True
        self._ended()
        if self._cuda is not None:
            cuda.abort(self)
        self._pg.abort()
        _core.flight_recorder_dump_after(f"process group {self._trace[0]} aborted")

    def _ended(self) -> None:
        self._is_ended = True
        self._move_on()
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
