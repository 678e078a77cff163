"""Every private torch API rustdist uses, in one place: names move between torch releases.

Checked on torch 2.6.0 (the oldest supported), 2.13.0 (CI's pin) and 2.15.0 (the newest). Everything else in
rustdist uses torch's public API only. Imported only when torch is importable.
"""

from __future__ import annotations

import inspect
from collections import deque
from typing import Any

import torch
import torch.distributed as _td

_c10d = torch._C._distributed_c10d

#: Base class of the Works rustdist hands to torch (``torch.distributed._Work``): torch's C++
#: calls its ``wait`` and ``get_future``.
WorkBase: type = _td._Work

_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

#: torch before 2.13 keeps only the C++ half of a Python Work a functional collective
#: registers: once the Python object is gone, ``wait_tensor`` calls the base ``Work::wait``,
#: which never returns. Only there are recent Works kept alive (bounded by bytes below).
KEEPS_PYTHON_WORK = _VERSION >= (2, 13)



def sync_call_takes_no_work() -> bool:
    """Whether torch's synchronous collectives take a backend's None as "synchronised"
    (``elif work is not None: work.wait()``, in every one of them at once): torch 2.13 and
    2.15 do, 2.6 calls ``wait()`` on whatever it gets. Read from torch's source, as the
    release that added it is not known."""
    try:
        return all("work is not None" in inspect.getsource(getattr(_td.distributed_c10d, name))
                   for name in ("all_reduce", "broadcast", "barrier"))
    except (OSError, TypeError):  # no source to read: assume the old behaviour
        return False


#: Output bytes of the recent Works kept alive on torch < 2.13.
_KEPT_BYTES_LIMIT = 256 << 20
_kept: deque = deque()
_kept_bytes = 0


def keep_for_functional_collectives(work: Any, outputs: list[Any]) -> None:
    """On torch < 2.13, keeps ``work`` alive until 256 MiB of newer outputs pushed it out (a
    functional collective waited on later than that would hang there); no-op elsewhere."""
    global _kept_bytes
    if KEEPS_PYTHON_WORK:
        return
    nbytes = sum(t.numel() * t.element_size() for t in outputs)
    _kept.append((work, nbytes))
    _kept_bytes += nbytes
    while _kept_bytes > _KEPT_BYTES_LIMIT and len(_kept) > 1:
        _kept_bytes -= _kept.popleft()[1]


def register_inflight_outputs(work: Any, outputs: list[Any]) -> None:
    """Under ``_allow_inflight_collective_as_graph_input()`` wait_tensor finds the Work of an
    in-flight graph input by tensor: register it."""
    if _c10d._allow_inflight_collective_as_graph_input():
        for t in outputs:
            _c10d._register_work(t, work)


def current_raw_stream(device: int) -> int:
    """The ``cudaStream_t`` of the current stream of CUDA device ``device``, as an int
    (what ``torch.cuda.current_stream(device).cuda_stream`` says, without building a Stream
    object: a few microseconds on every CUDA call)."""
    return torch._C._cuda_getCurrentRawStream(device)


def resolve_group(group_name: str) -> Any:
    """The process group torch registered under ``group_name``."""
    return _c10d._resolve_process_group(group_name)


def allgather_options() -> Any:
    """Default options of an all_gather on any torch group (C++ groups need the object)."""
    return _c10d.AllgatherOptions()


def abort_process_group(group: Any) -> None:
    """``torch.distributed.distributed_c10d._abort_process_group``: aborts ``group`` (None or
    WORLD: every group) through each group's ``abort()``, then forgets it (them: the world is
    uninitialised)."""
    _td.distributed_c10d._abort_process_group(group)


def register_functional_cpu_kernel(op: str, fn: Any) -> Any:
    """Registers ``fn`` as the CPU kernel of ``_c10d_functional.<op>``: torch's own asks the
    group for a per-device C++ backend, which a Python group lacks. Keep the result alive."""
    lib = torch.library.Library("_c10d_functional", "IMPL")
    lib.impl(op, fn, "CPU")
    return lib


def shrink_python_groups() -> None:
    """Lets ``torch.distributed.shrink_group`` shrink a group whose backend is a Python
    ``ProcessGroup`` (rustdist's), and fixes its members for such groups:

    - torch wraps what the backend's ``shrink`` returns in a new C++ ``ProcessGroup``, which
      takes only a C++ ``Backend``. A Python group becomes the new group itself instead, as
      ``new_group`` already does with Python groups (``_new_process_group_helper``).
    - torch (2.13) removes the excluded *group* ranks from the group's *global* ranks, which
      differ in a subgroup (``[1, 2, 3]`` less group rank 1 came out ``[1, 3]``): they are
      turned into global ranks first.

    Every other backend's groups go torch's way. No-op on a torch without ``shrink_group``
    (before 2.10)."""
    c10d = _td.distributed_c10d
    create = getattr(c10d, "_create_shrunk_process_group", None)
    finalize = getattr(c10d, "_finalize_shrunk_group", None)
    if create is None or finalize is None or getattr(create, "_rustdist", False):
        return

    def create_shrunk(new_backend: Any, remaining_ranks: list[int], metadata: dict,
                      is_default_group: bool) -> Any:
        if not isinstance(new_backend, _td.ProcessGroup):
            return create(new_backend, remaining_ranks, metadata, is_default_group)
        desc = ("default:shrunken" if is_default_group
                else f"{metadata['original_group_name']}:shrunk")
        new_backend._set_group_name(metadata["new_group_name"])
        new_backend._set_group_desc(desc)
        return new_backend

    def finalize_shrunk(group_info: dict, excluded_ranks_set: set, new_backend: Any) -> Any:
        if isinstance(new_backend, _td.ProcessGroup):
            ranks = c10d.get_process_group_ranks(group_info["process_group"])
            excluded_ranks_set = {ranks[r] for r in excluded_ranks_set}
        return finalize(group_info, excluded_ranks_set, new_backend)

    create_shrunk._rustdist = True  # type: ignore[attr-defined]
    c10d._create_shrunk_process_group = create_shrunk
    c10d._finalize_shrunk_group = finalize_shrunk


__all__ = [
    "KEEPS_PYTHON_WORK", "abort_process_group", "allgather_options", "current_raw_stream",
    "WorkBase",
    "keep_for_functional_collectives", "register_functional_cpu_kernel",
    "register_inflight_outputs", "resolve_group", "shrink_python_groups",
]
