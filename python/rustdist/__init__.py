"""rustdist: collective communication with a Rust engine and the torch.distributed API.

``import rustdist as dist`` in place of ``import torch.distributed as dist``: the same
functions, arguments and errors, on torch CPU tensors or numpy arrays.
"""

from ._core import FileStore, HashStore, PrefixStore, Store, TCPStore, __version__
from ._errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from .distributed_c10d import (
    Backend,
    GroupMember,
    ProcessGroup,
    ReduceOp,
    Work,
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    barrier,
    broadcast,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    recv,
    reduce_scatter_single,
    reduce_scatter_tensor,
    send,
)

__all__ = [
    "Backend", "DistBackendError", "DistError", "DistNetworkError", "DistStoreError",
    "FileStore", "GroupMember", "HashStore", "PrefixStore", "ProcessGroup", "ReduceOp", "Store",
    "TCPStore", "Work", "__version__", "all_gather", "all_gather_into_tensor",
    "all_gather_single", "all_reduce", "barrier", "broadcast", "default_pg_timeout",
    "destroy_process_group", "get_backend", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "group", "init_process_group",
    "irecv", "is_available", "is_initialized", "isend", "recv", "reduce_scatter_single",
    "reduce_scatter_tensor", "send",
]
