"""torch 2.14's reconfigure API on rustdist groups: a group's handle, and the re-forming of a
group over any set of handles (the same peers, fewer, more, two groups merged, a replacement
process), as ``ProcessGroup.get_reconfigure_handle`` and ``ProcessGroup.reconfigure`` run it.

A handle (``rustdist:<stable rank>:<token>:<store>``) names a process's group: the global
rank it first had (kept across reconfigures, as gloo keeps it), a random token that tells two
processes apart (a replacement differs from the process it replaces) and the address of the
store the group was made on. It carries no secret: whoever joins still goes through the store
and the links' handshake (``RUSTDIST_AUTH_KEY``, TLS), so a handle lets no stranger in.

Re-forming is a rendezvous under ``reconfigure/<name>/<uuid>`` on the store under the group's
store's prefixes (the one the handle names; the group's ``<name>`` is its first): the new rank 0
claims the uuid (a compare-and-set that fails for a uuid claimed before), every other member
waits for that claim and checks it was made for the same handles, and each member counts
itself in, so that a process that takes part twice under one uuid is refused too. Then the
members make a new engine group there (links on demand, shared
memory between members on one host, heartbeats over the new membership), all within the
reconfigure's timeout; a member that never comes is named by its new rank and handle. Once
all have connected they delete the rendezvous's keys; the uuid stays listed under
``reconfigure/<name>/used``, which refuses it later.

A reconfigure of a failed group (a member died) that only leaves members out, the rest in
their order, is a shrink: it goes through ``shrink_group``'s mechanism instead (the survivors'
links, no store, no rendezvous: it works when the store's process is the one that died),
when the group knows its members' tokens, as it does after its first reconfigure
(:func:`excluded`).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any, Optional, Union

from . import _core
from .status import root_store

_SCHEME = "rustdist"


def new_token() -> str:
    """A token that tells this group object from every other process's."""
    return secrets.token_hex(8)


def store_address(store: Any) -> str:
    """Where the store under ``store``'s prefixes is served: ``host:port`` of a TCP store,
    ``file:<path>`` of a file store; empty for a store only this process can reach."""
    root = root_store(store)
    host, port = getattr(root, "host", None), getattr(root, "port", None)
    if isinstance(host, str) and isinstance(port, int):
        return f"{host}:{port}"
    path = getattr(root, "path", None)
    return f"file:{path}" if isinstance(path, str) else ""


def make_handle(stable_rank: int, token: str, store: Any) -> str:
    """The handle of the group of this process whose first global rank is ``stable_rank``."""
    return f"{_SCHEME}:{stable_rank}:{token}:{store_address(store)}"


def parse_handle(handle: Any) -> tuple[int, str, str]:
    """(stable rank, token, store address) of a rustdist handle; RuntimeError for anything
    else."""
    parts = handle.split(":", 3) if isinstance(handle, str) else []
    if len(parts) != 4 or parts[0] != _SCHEME or not parts[1].isdigit() or not parts[2]:
        raise RuntimeError(f"Invalid rustdist reconfigure handle: {handle!r}")
    return int(parts[1]), parts[2], parts[3]


def ordered(handles: Union[set[str], frozenset[str], list[str], tuple[str, ...]]) -> list[str]:
    """The members by new rank: a list as given; a set sorted (stable rank, then token), so
    that every member numbers them alike. Checked: not empty, no duplicates, each parses."""
    if isinstance(handles, (set, frozenset)):
        listed = sorted(handles, key=lambda h: (parse_handle(h)[0], h))
    elif isinstance(handles, (list, tuple)):
        listed = list(handles)
    else:
        raise TypeError(f"handles must be a list or a set of handles, got "
                        f"{type(handles).__name__}")
    if not listed:
        raise RuntimeError("Reconfigure requires at least one handle")
    if len(set(listed)) != len(listed):
        raise RuntimeError("Reconfigure handles must be unique")
    for h in listed:
        parse_handle(h)
    return listed


def options(opts: Any) -> tuple[int, Any, Optional[timedelta]]:
    """(uuid, handles, timeout) of torch's ``ReconfigureOptions`` or any object with those
    attributes; ``hints`` are accepted and ignored (rustdist has none yet)."""
    uuid = getattr(opts, "uuid", None)
    if not isinstance(uuid, int) or isinstance(uuid, bool):
        raise TypeError(f"reconfigure: uuid must be an int, got {uuid!r}")
    timeout = getattr(opts, "timeout", None)
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"reconfigure: timeout must be a datetime.timedelta, got {timeout!r}")
    return uuid, getattr(opts, "handles", None), timeout


def uuid_used(uuid: int) -> RuntimeError:
    return RuntimeError(f"rustdist reconfigure uuid {uuid} was already used; each reconfigure() "
                        "requires a unique uuid")


def _who(rank: int, handle: str) -> str:
    stable, token, _ = parse_handle(handle)
    return f"new rank {rank} (first global rank {stable}, handle token {token})"


def position(members: list[str], me: str) -> int:
    """This process's new rank: where its handle ``me`` is among ``members``."""
    try:
        return members.index(me)
    except ValueError:
        raise RuntimeError("Local rustdist reconfigure handle is not part of the new "
                           f"communicator: {me!r} is not among {members!r}") from None


def excluded(current: Optional[list[str]], members: list[str]) -> Optional[list[int]]:
    """The current ranks a reconfigure over ``members`` leaves out, when it is a shrink: every
    member is a current one (``current``: the tokens of the current members by rank, known
    after a reconfigure) and they keep their order. None for anything else (a newcomer, a new
    order, the same members: a rendezvous then)."""
    if current is None:
        return None
    tokens = [parse_handle(h)[1] for h in members]
    if not set(tokens) <= set(current):
        return None
    ranks = [current.index(t) for t in tokens]
    if ranks != sorted(ranks) or len(ranks) == len(current):
        return None
    kept = set(ranks)
    return [r for r in range(len(current)) if r not in kept]


def form(store: Any, name: str, uuid: int, members: list[str], rank: int,
         timeout: timedelta) -> Any:
    """Re-forms the group over ``members`` (handles by new rank; this process is ``rank``) on
    ``store``: the new engine group. Every member calls it with the same uuid and members,
    within ``timeout``."""
    me = members[rank]
    mine = parse_handle(me)[2]
    for h in members:
        theirs = parse_handle(h)[2]
        if mine and theirs and theirs != mine:
            raise RuntimeError(f"reconfigure uuid {uuid}: handle {h!r} names the store at "
                               f"{theirs}, this process's group is on {mine}: every member "
                               "must share one store")
    # On the store under every prefix: torch's wrappers of a Python store cannot delete keys.
    store = root_store(store)
    key, used = f"reconfigure/{name}/{uuid}", f"reconfigure/{name}/used"
    plan = hashlib.sha256("\n".join(members).encode()).hexdigest()[:16]
    token = parse_handle(me)[1]
    if store.check([used]) and str(uuid) in _text(store.get(used)).split(","):
        raise uuid_used(uuid)
    if store.add(f"{key}/member/{token}", 1) > 1:
        raise uuid_used(uuid)
    if rank == 0:
        claim = f"{plan}:{token}:{new_token()}"
        if _text(store.compare_set(f"{key}/claimed", "", claim)) != claim:
            raise uuid_used(uuid)
    else:
        try:
            store.wait([f"{key}/claimed"], timeout)
        except Exception as e:
            raise type(e)(f"reconfigure uuid {uuid}: {_who(0, members[0])} did not arrive "
                          f"within {timeout}: {e}") from e
        claimed_plan, claimer, _ = _text(store.get(f"{key}/claimed")).split(":")
        if claimer != parse_handle(members[0])[1]:
            raise uuid_used(uuid)
        if claimed_plan != plan:
            raise RuntimeError(f"reconfigure uuid {uuid}: the members' handles differ from new "
                               "rank 0's: every member must pass the same handles (a list in "
                               "the same order, or the same set)")
    # Everyone there before connecting: a member that never comes is named here.
    here = [f"{key}/here/{r}" for r in range(len(members))]
    store.set(here[rank], "1")
    try:
        store.wait(here, timeout)
    except Exception as e:
        missing = [r for r in range(len(members)) if not store.check([here[r]])]
        raise type(e)(f"reconfigure uuid {uuid}: "
                      f"{'; '.join(_who(r, members[r]) for r in missing)} did not arrive "
                      f"within {timeout}: {e}") from e
    try:
        core = _core.ProcessGroup(store, rank, len(members), timeout.total_seconds(), key)
    except Exception as e:
        who = "; ".join(_who(r, h) for r, h in enumerate(members))
        raise type(e)(f"reconfigure uuid {uuid} failed on new rank {rank} ({who}): {e}") from e
    # Every member has read what it needed once all have connected: the store forgets this
    # reconfigure but that its uuid was used (one key for all uuids).
    core.forget_rendezvous(store)
    store.delete_key(f"{key}/member/{token}")
    store.delete_key(here[rank])
    if rank == 0:
        store.append(used, f"{uuid},")
        store.delete_key(f"{key}/claimed")
    return core


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["excluded", "form", "make_handle", "new_token", "options", "ordered", "parse_handle",
           "position", "store_address", "uuid_used"]
