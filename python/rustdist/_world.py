"""The world: the default group and its store, ``init_process_group`` and its rendezvous,
``new_group`` and its subgroups, destroying and aborting them, rank translation, and
:func:`api`, which resolves ``group=`` for every function of torch's API.

With torch importable, torch's world is the world (``_torch_world``): the groups are made
through ``torch.distributed`` with backend ``"rustdist"`` (the torch door builds them) and
``_default_pg`` caches torch's default group; without torch, rustdist keeps the world here.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from datetime import timedelta
from typing import Any, Callable, Optional, TypeVar

from . import _core, _debug, cuda, status
from ._debug import logger
from ._backend import Backend, backend_name, check_device_id
from ._group import (
    SHRINK_ABORT,
    SHRINK_DEFAULT,
    ProcessGroup,
    check_shrink_args,
    default_pg_timeout,
    made_by_torch,
)
from ._rendezvous import rendezvous, store_prefix

_torch_world: Any = None
try:  # torch is optional: without it rustdist keeps its world itself.
    from . import _torch_world
except ImportError:
    pass

_F = TypeVar("_F", bound=Callable[..., Any])


# World state. _default_pg is the default group: in torch's world a cache of torch's, found
# on first use and forgotten when that group ends (read by the fast path, _core.fast_init).
# _default_store is the store the default group was built on (kept alive with it: rank 0's
# TCPStore serves the others). _generation numbers this process's inits, so that
# re-initialising on the same store never reads an earlier init's keys.
_default_pg: Optional[ProcessGroup] = None
_default_store: Any = None
_generation = 0
# Subgroups of this init by name, destroyed with the default group. Names are "1", "2", ...
# counted by new_group (which every rank calls), or hashes of the ranks with
# use_local_synchronization (which only members call).
_subgroups: dict[str, ProcessGroup] = {}
_group_count = 0
_local_group_counts: dict[tuple[int, ...], int] = {}
_non_member_ranks: Optional[list[int]] = None

_NOT_INITIALIZED = (
    "Default process group has not been initialized, please make sure to call init_process_group."
)


def _default() -> Any:
    """The default group, or None before init: rustdist's, or (torch importable) torch's
    default group, which is a rustdist group unless torch was initialised with another
    backend. Refreshes the cache the collectives read."""
    if _torch_world is None:
        return _default_pg
    pg = _torch_world.default_group()
    _cache_default(pg if isinstance(pg, ProcessGroup) else None)
    return pg


def _cache_default(pg: Optional[ProcessGroup]) -> None:
    """Caches torch's default group, until it ends (torch shuts groups down and aborts them
    without rustdist's world)."""
    global _default_pg
    _default_pg = pg
    if pg is not None:
        pg._on_end = _forget_default
        _translate_as_default(pg)


def _translate_as_default(pg: ProcessGroup) -> None:
    """The default group's ranks are the global ones, as torch has it (``group is WORLD``),
    also after a shrink: its members keep their first global ranks in ``_ranks`` (what
    ``get_process_group_ranks`` lists), but ranks given to it are its own."""
    pg._group_ranks = None


def _forget_default(pg: ProcessGroup) -> None:
    global _default_pg
    if _default_pg is pg:
        _default_pg = None


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


def resolve(grp: Any) -> Optional[ProcessGroup]:
    """The group to run on (``grp`` or the default); None when this rank is not a member."""
    pg = _default_pg if grp is None else grp
    if isinstance(pg, ProcessGroup):
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


def warn_not_member(op: str) -> None:
    """torch's warning for a call on a group this rank is not a member of."""
    default = _default()
    rank = -1 if default is None else default._rank
    warnings.warn(
        f"Running {op} on global rank {rank} which does not belong to the given group.",
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """warnings' stacklevel, from the caller of this function's caller, of the first frame
    outside rustdist: the user's call, past the op, its wrapper (:func:`api`) and its fast
    path."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("rustdist"):
        level, frame = level + 1, frame.f_back
    return level


def peer(pg: ProcessGroup, rank: Optional[int], group_rank: Optional[int], op: str,
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


def api(fn: Optional[_F] = None, *, check: Optional[Callable[..., None]] = None,
        non_member: Any = None) -> Any:
    """Decorator of a function of torch's API that takes ``group=``: the function runs with
    ``group`` resolved to this rank's rustdist group (:func:`resolve`); on a rank that is not a
    member it warns as torch does and returns ``non_member`` instead. ``check``, called with
    the function's arguments first, makes the checks torch makes before it looks at the group.
    An exception the call raises is logged (logger ``rustdist``, INFO) on its way out.

    The wrapper is compiled with the function's own parameters (``_debug.compiled_like``):
    collectives run in tight loops, where packing ``*args, **kwargs`` would cost more than
    the call."""
    if fn is None:
        return lambda f: api(f, check=check, non_member=non_member)
    name = fn.__name__

    def log(e: Exception) -> None:
        _debug.log_failure(name, e)

    body = ("    try:\n"
            + ("        check({call})\n" if check is not None else "")
            + "        group = resolve(group)\n"
              "        if group is None:\n"
              "            warn_not_member(name)\n"
              "            return non_member\n"
              "        return fn({call})\n"
              "    except Exception as e:\n"
              "        log(e)\n"
              "        raise\n")
    return _debug.compiled_like(fn, body, {
        "fn": fn, "check": check, "log": log, "name": name, "non_member": non_member,
        "resolve": resolve, "warn_not_member": warn_not_member})


def is_available() -> bool:
    """Return ``True`` if the distributed package is available."""
    return True


def is_initialized() -> bool:
    """Check if the default process group has been initialized."""
    return _default() is not None


def _get_default_store() -> Any:
    """The store the default group was initialised on (torch's private helper of this name,
    which torch's tests use); ValueError before init."""
    if _default_store is not None:
        return _default_store
    if _torch_world is not None and is_initialized():  # a world made by torch.distributed
        import torch.distributed.distributed_c10d as torch_c10d

        return torch_c10d._get_default_store()
    raise ValueError(_NOT_INITIALIZED)


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
    enable_reconfigure: bool = False,
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
        enable_reconfigure: Accepted, as torch 2.14 has it: every rustdist group can be
            re-formed over new peers (``_reconfigure``), and works from its creation on
            (gloo's refuses collectives until its first reconfigure).

    ``TORCH_DISTRIBUTED_DEBUG`` (or ``RUSTDIST_DEBUG``), when set, sets the debug level here
    as well as at import.
    """
    global _default_pg, _default_store, _generation
    if is_initialized():
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    name = backend_name(backend, Backend.RUSTDIST, "init_process_group")
    check_device_id(device_id)
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
        store, rank, world_size = rendezvous(init_method or "env://", rank, world_size, timeout,
                                             _generation)
        store.set_timeout(timeout)
    if not 0 <= rank < world_size:
        raise ValueError(f"Invalid rank {rank}: it must be in [0, world_size={world_size})")
    if _torch_world is not None:
        pg = _torch_world.init(store, store_prefix(_generation), rank, world_size, timeout,
                               enable_reconfigure)
        _cache_default(pg)
    else:
        prefixed = _core.PrefixStore(store_prefix(_generation), store)
        core = _core.ProcessGroup(prefixed, rank, world_size, timeout.total_seconds(), "0")
        pg = ProcessGroup(core, list(range(world_size)), name, world=True, store=prefixed)
        status.publish(store, rank, world_size, core.status_address)
        _default_pg = pg
    pg._backend = name
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
        for gone in list(made_by_torch) if pg is default else [pg]:
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
    pg = resolve(group)
    return -1 if pg is None else pg._rank


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """Return the number of processes in ``group`` (default: the default group), or -1 if
    this process is not part of the group."""
    pg = resolve(group)
    return -1 if pg is None else pg._size


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """Return the backend of ``group`` (default: the default group) as a lowercase string:
    the name given to ``init_process_group`` (``"rustdist"`` when none was)."""
    pg = resolve(group)
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


@_debug.exception_logger
def new_group(ranks: Optional[list[int]] = None, timeout: Optional[timedelta] = None,
              backend: Optional[str] = None, pg_options: Optional[Any] = None,
              use_local_synchronization: bool = False, group_desc: Optional[str] = None,
              device_id: Optional[Any] = None, sort_ranks: bool = True,
              enable_reconfigure: bool = False) -> Any:
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
        enable_reconfigure: Accepted (see ``init_process_group``).

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
    name = backend_name(backend, default._backend, "new_group")
    check_device_id(device_id)
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
                                    group_desc, sort_ranks, enable_reconfigure)
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
    store = _core.PrefixStore(f"{store_prefix(_generation)}/group/{group_name}", _default_store)
    core = _core.ProcessGroup(store, ranks.index(global_rank), len(ranks),
                              timeout.total_seconds(), group_name)
    pg = ProcessGroup(core, ranks, name, world=False, store=store)
    pg._trace_as(group_name, group_desc or "undefined")
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
        cuda.new_subgroup(parent, child if isinstance(child, ProcessGroup) else None)


@_debug.exception_logger
def shrink_group(ranks_to_exclude: list[int], group: Optional[ProcessGroup] = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Optional[Any] = None) -> Any:
    """Shrinks a process group by excluding specified ranks.

    Creates and returns a new, smaller process group comprising only the ranks from the
    original ``group`` that were not in ``ranks_to_exclude``, renumbered in order. Only the
    remaining ranks call it; the excluded ones may be dead. rustdist's groups keep their links
    and store: no rendezvous, and nothing of the old group (half-sent messages, an excluded
    rank's data) reaches the new one.

    Args:
        ranks_to_exclude: Ranks of ``group`` to leave out.
        group: The process group to shrink (default: the default group).
        shrink_flags: ``SHRINK_DEFAULT`` (raise if operations are still pending on the group,
            unless it has failed) or ``SHRINK_ABORT`` (abort them first).
        pg_options: Ignored (backend options of torch's backends).

    Returns:
        The new group. When the default group was shrunk, the new group becomes the default
        group (ranks renumbered) and every other group is destroyed, as torch does.

    Raises:
        TypeError, ValueError: for invalid ``ranks_to_exclude`` or ``shrink_flags``.
        RuntimeError: if an excluded rank calls it, or when shrinking fails (a survivor
            disagrees about the ranks to exclude, dies or does not call it in time).
    """
    if _torch_world is not None:  # torch's world: torch's shrink_group, on rustdist's backend
        shrunk = _torch_world.shrink_group(ranks_to_exclude, group, shrink_flags, pg_options)
        _default()
        return shrunk
    global _default_pg
    pg = _default_pg if group is None else group
    if pg is None:
        raise ValueError(_NOT_INITIALIZED)
    if not isinstance(pg, ProcessGroup):
        raise ValueError(f"Invalid process group specified: {group!r}")
    excluded = check_shrink_args(ranks_to_exclude, shrink_flags, pg)
    is_default = pg is _default_pg
    if is_default:  # their ranks no longer make sense: torch aborts them
        for sub in reversed(list(_subgroups.values())):
            sub.abort()
        _subgroups.clear()
        _local_group_counts.clear()
    elif _subgroups.get(pg.group_name) is not pg:
        raise ValueError("Invalid process group specified")
    new = pg._shrunk(excluded, shrink_flags == SHRINK_ABORT)
    logger.info("rank %d: shrank process group %s excluding %s", pg._rank, pg.group_name,
                excluded)
    pg._shutdown()
    if is_default:
        _default_pg = new
        _translate_as_default(new)
    else:
        del _subgroups[pg.group_name]
        _subgroups[new.group_name] = new
    return new


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


__all__ = [
    "Backend", "GroupMember", "ProcessGroup", "api", "default_pg_timeout",
    "destroy_process_group", "get_backend", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "group", "init_process_group",
    "is_available", "is_initialized", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "peer", "resolve", "shrink_group", "warn_not_member",
    "SHRINK_ABORT", "SHRINK_DEFAULT",
]
