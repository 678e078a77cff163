"""One world for both front doors (imported when torch is importable).

rustdist creates its default group and its subgroups through torch.distributed's public API
(``init_process_group`` and ``new_group`` with backend ``"rustdist"``), so torch's world is
rustdist's world: torch APIs with no ``group=`` (DDP, FSDP2, DeviceMesh, DTensor, Join,
ZeroRedundancyOptimizer, torch.distributed.checkpoint, functional collectives) run on
rustdist's engine, and after ``torch.distributed.init_process_group("rustdist")`` rustdist's
functions use that world. Only public torch API is used here, and torch's
``_abort_process_group`` (through ``_torch_private``).
"""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as td

from . import _core
from ._group import BACKEND_NAME
from ._torch_private import abort_process_group


class StoreAdapter(td.Store):
    """A rustdist store as a ``torch.distributed.Store`` (torch's ``init_process_group``
    takes only those); every call goes to the rustdist store."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._store = store

    @property
    def underlying_store(self) -> Any:
        """The rustdist store it forwards to (named as a PrefixStore names what it wraps)."""
        return self._store

    def set(self, key: str, value: Any) -> None:  # noqa: D102 - torch's Store methods
        self._store.set(key, value)

    def get(self, key: str) -> bytes:  # noqa: D102
        return self._store.get(key)

    def add(self, key: str, value: int) -> int:  # noqa: D102
        return self._store.add(key, value)

    def append(self, key: str, value: Any) -> None:  # noqa: D102
        self._store.append(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:  # noqa: D102
        return self._store.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:  # noqa: D102
        return self._store.check(keys)

    def delete_key(self, key: str) -> bool:  # noqa: D102
        return self._store.delete_key(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:  # noqa: D102
        return self._store.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:  # noqa: D102
        self._store.multi_set(keys, values)

    def wait(self, keys: list[str], timeout: Optional[timedelta] = None) -> None:  # noqa: D102
        if timeout is None:
            self._store.wait(keys)
        else:
            self._store.wait(keys, timeout)


# The store the default group was created on. torch keeps only the C++ half of a Python
# Store subclass: this reference keeps the adapter's Python methods alive with the world.
_world_store: Any = None


def torch_store(store: Any, prefix: str) -> Any:
    """``store`` (rustdist's or torch's) under ``prefix``, as a torch store."""
    if isinstance(store, td.Store):
        return td.PrefixStore(prefix, store)
    return StoreAdapter(_core.PrefixStore(prefix, store))


def _reconfigurable(fn: Callable[..., Any], enable: bool) -> dict[str, bool]:
    """``enable_reconfigure`` for torch's ``fn`` where torch takes it (2.14+); a torch without
    it needs none (rustdist groups can be re-formed either way)."""
    return {"enable_reconfigure": enable} if enable and "enable_reconfigure" in \
        inspect.signature(fn).parameters else {}


def init(store: Any, prefix: str, rank: int, size: int, timeout: timedelta,
         enable_reconfigure: bool = False) -> Any:
    """Creates torch's default group, a rustdist group, on ``store`` (keys under ``prefix``);
    returns it."""
    global _world_store
    _world_store = torch_store(store, prefix)
    td.init_process_group(backend=BACKEND_NAME, store=_world_store, rank=rank,
                          world_size=size, timeout=timeout,
                          **_reconfigurable(td.init_process_group, enable_reconfigure))
    return td.group.WORLD


def default_group() -> Any:
    """torch's default group (a rustdist group, or another backend's), or None."""
    return td.group.WORLD if td.is_initialized() else None


def new_group(ranks: Optional[list[int]], timeout: timedelta, pg_options: Any,
              use_local_synchronization: bool, group_desc: Optional[str],
              sort_ranks: bool, enable_reconfigure: bool = False) -> Any:
    """torch's ``new_group`` with backend "rustdist": the group, or what torch returns to a
    non-member (``GroupMember.NON_GROUP_MEMBER``, or None with local synchronization)."""
    extra: dict[str, Any] = dict(_reconfigurable(td.new_group, enable_reconfigure))
    if _NEW_GROUP_SORTS:
        extra["sort_ranks"] = sort_ranks
    elif not sort_ranks and ranks is not None and ranks != sorted(ranks):
        raise ValueError(f"new_group(sort_ranks=False) needs torch >= 2.7 (torch "
                         f"{torch.__version__} orders group ranks by global rank)")
    return td.new_group(ranks=ranks, timeout=timeout, backend=BACKEND_NAME,
                        pg_options=pg_options,
                        use_local_synchronization=use_local_synchronization,
                        group_desc=group_desc, **extra)


#: torch's new_group takes sort_ranks from 2.7 on.
_NEW_GROUP_SORTS = "sort_ranks" in inspect.signature(td.new_group).parameters


def shrink_group(ranks_to_exclude: Any, group: Any, shrink_flags: Any, pg_options: Any) -> Any:
    """torch's ``shrink_group`` (rustdist's backend implements ``shrink``); a torch without it
    (before 2.10) raises saying so."""
    shrink = getattr(td, "shrink_group", None)
    if shrink is None:
        raise RuntimeError(f"shrink_group needs torch >= 2.10 (torch {torch.__version__} has no "
                           "torch.distributed.shrink_group)")
    return shrink(ranks_to_exclude, group, shrink_flags, pg_options)


def _end(group: Any, torch_end: Callable[[Any], None]) -> None:
    """Ends ``group`` with torch's ``torch_end``; forgets the world's store once torch's world
    is gone."""
    global _world_store
    torch_end(group)
    if not td.is_initialized():
        _world_store = None


def destroy(group: Any) -> None:
    """torch's ``destroy_process_group``: shuts the group(s) down (each rustdist group's
    ``shutdown`` leaves its engine group) and forgets them."""
    _end(group, td.destroy_process_group)


def abort(group: Any) -> None:
    """torch's ``_abort_process_group``: aborts the group(s) (each rustdist group's
    ``abort``) and forgets them."""
    _end(group, abort_process_group)


__all__ = ["StoreAdapter", "abort", "default_group", "destroy", "init", "new_group",
           "shrink_group", "torch_store"]
