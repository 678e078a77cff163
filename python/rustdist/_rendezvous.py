"""Finding the peers: what launchers put in the environment (torchrun, Slurm's srun, Open
MPI's mpirun), the ``init_method`` URLs (``env://``, ``tcp://``, ``file://``) and the TCPStore
an init meets on."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Optional
from urllib.parse import parse_qsl, urlparse

from . import _core
from ._errors import DistNetworkError, DistStoreError

# Where launchers put a process's rank, world size and node-local rank: torchrun (and torch's
# launch utility), then Slurm's srun, then Open MPI's mpirun.
_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")

_SERVER_TAG_KEY = "rustdist/server_generation"


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


def store_prefix(generation: int) -> str:
    """Keys of init number ``generation`` of this process: apart from its earlier inits, and
    (under torchrun, whose store outlives restarts) from earlier attempts of the job."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"rustdist/{attempt}/{generation}"


def rendezvous(url: str, rank: int, world_size: int, timeout: timedelta,
               generation: int) -> tuple[Any, int, int]:
    """The store, rank and world size that ``init_method`` (env://, tcp://, file://) names,
    for init number ``generation`` of this process."""
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
        try:
            import torch.distributed as td
        except ImportError:
            raise RuntimeError(
                "torchrun's agent store needs torch (its TCPStore protocol)") from None
        return td.TCPStore(host, port, world_size, False, timeout=timeout), rank, world_size
    return _tcp_store(host, port, rank, world_size, timeout, generation), rank, world_size


def _tcp_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta,
               generation: int) -> Any:
    """The TCPStore of an init: rank 0 hosts it, the others connect.

    When an init follows a destroy on the same port, a fast rank can reach the previous
    init's server before rank 0 has closed it. So rank 0 tags its server with the init
    generation, and the others reconnect (backing off) until they reach the current one."""
    tag = str(generation).encode()
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


__all__ = ["get_node_local_rank", "rendezvous", "store_prefix"]
