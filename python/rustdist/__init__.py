"""rustdist: collective communication with a Rust engine and the torch.distributed API.

``import rustdist as dist`` in place of ``import torch.distributed as dist``: the same
functions, arguments and errors, on torch CPU tensors or numpy arrays. Importing rustdist also
registers the ``"rustdist"`` backend with ``torch.distributed`` (when torch is installed), and
rustdist's world is torch's: after ``rustdist.init_process_group()``, DDP, FSDP2, DeviceMesh
and every torch API run on rustdist's engine. Every other public name of torch.distributed is
reachable here too (``rustdist.DeviceMesh``, ``rustdist.checkpoint``, ...), resolved lazily.
"""

import warnings as _warnings
from typing import Any as _Any

from . import _torchless

# The status command imports the package without torch (see _torchless).
_status_command = _torchless.status_command()
if _status_command:
    _torchless.hide()

from ._core import FileStore, HashStore, PrefixStore, Store, TCPStore, __version__
from . import flight_recorder
from ._breakpoint import breakpoint
from ._debug import (
    DebugLevel,
    get_debug_level,
    set_debug_level,
    set_debug_level_from_env,
)
from ._errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from ._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from ._reduce_op import _make_nccl_premul_sum, make_premul_sum
from ._namespace import install as _install_namespace
from ._namespace import names as _torch_names
from ._namespace import resolve as _resolve_torch_name
from ._torch_backend import register as _register_torch_backend
from .device_mesh import init_device_mesh
from .distributed_c10d import (
    SHRINK_ABORT,
    SHRINK_DEFAULT,
    Backend,
    GroupMember,
    P2POp,
    ProcessGroup,
    ReduceOp,
    Work,
    _get_reconfigure_handle,
    _new_window,
    _reconfigure,
    _set_pg_timeout,
    _supports_reconfigure,
    _supports_window,
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    default_pg_timeout,
    destroy_process_group,
    gather,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    monitored_barrier,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    send,
    shrink_group,
    stats,
)
from . import status

_register_torch_backend()
_install_namespace()
if _status_command:
    _torchless.show()


def __getattr__(name: str) -> _Any:
    """torch.distributed's ``name`` for a name rustdist does not define (resolved lazily)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _resolve_torch_name(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_torch_names()))


try:  # like torch, the debug level starts from the environment
    set_debug_level_from_env()
except ValueError as _e:
    _warnings.warn(f"{_e}; debug level left at OFF", stacklevel=2)

__all__ = [
    "SHRINK_ABORT", "SHRINK_DEFAULT",
    "Backend", "DebugLevel", "DistBackendError", "DistError", "DistNetworkError",
    "DistStoreError", "FileStore", "GroupMember", "HashStore", "P2POp", "PrefixStore",
    "ProcessGroup", "ReduceOp", "Store", "TCPStore", "Work", "__version__",
    "_make_nccl_premul_sum", "all_gather", "all_gather_coalesced", "all_gather_into_tensor",
    "all_gather_object", "all_gather_single", "all_reduce", "all_reduce_coalesced",
    "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv", "breakpoint",
    "broadcast", "broadcast_object_list", "default_pg_timeout", "destroy_process_group",
    "gather", "gather_object", "get_backend", "get_debug_level", "get_global_rank",
    "get_group_rank", "get_node_local_rank", "get_process_group_ranks", "get_rank",
    "get_world_size", "group", "init_device_mesh",
    "init_process_group", "irecv", "is_available", "is_initialized", "isend",
    "make_premul_sum", "monitored_barrier", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "recv", "recv_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "send", "send_object_list", "set_debug_level", "set_debug_level_from_env", "shrink_group",
    "stats", "status",
]
