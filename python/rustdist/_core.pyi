"""Type stubs for rustdist._core, the PyO3 extension (thin wrappers over rustdist-core).

Tensors cross this boundary zero-copy as (data pointer, element count, dtype code); the
`keep` argument is any Python object (usually a tuple of the tensors) that the engine holds
until the Work completes, so the memory stays alive while the engine uses it.

Dtype codes: float32=0 float64=1 float16=2 bfloat16=3 int8=4 int16=5 int32=6 int64=7
uint8=8 bool=9 complex64=10 complex128=11.
Reduce-op codes: SUM=0 PRODUCT=1 MIN=2 MAX=3 BAND=4 BOR=5 BXOR=6 AVG=7 PREMUL_SUM=8.
Timeouts are float seconds.
"""

from typing import Callable, Optional, Sequence

__version__: str

class Store:
    """Base class of every store; not constructible itself."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, value: int) -> int: ...
    def append(self, key: str, value: str | bytes) -> None: ...
    def check(self, keys: Sequence[str]) -> bool: ...
    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes: ...
    def delete_key(self, key: str) -> bool: ...
    def multi_get(self, keys: Sequence[str]) -> list[bytes]: ...
    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None: ...
    def num_keys(self) -> int: ...
    def wait(self, keys: Sequence[str], timeout: Optional[float] = None) -> None: ...
    def set_timeout(self, timeout: float) -> None: ...
    @property
    def timeout(self) -> float: ...

class TCPStore(Store):
    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: Optional[int] = None,
        is_master: bool = False,
        timeout: float = 300.0,
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: Optional[int] = None,
        use_libuv: bool = True,
    ) -> None: ...
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...

class FileStore(Store):
    def __init__(self, file_name: str, world_size: int = -1) -> None: ...
    @property
    def path(self) -> str: ...

class HashStore(Store):
    def __init__(self) -> None: ...

class PrefixStore(Store):
    def __init__(self, prefix: str, store: Store) -> None: ...
    @property
    def underlying_store(self) -> Store: ...

class Work:
    """A collective or point-to-point operation run by the engine."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until done; raises the op's error, or DistBackendError when
        `timeout` passes first (the Work keeps running and can be waited on again)."""
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    def exception(self) -> Optional[BaseException]: ...
    def source_rank(self) -> int:
        """Sender's rank for a completed receive; raises RuntimeError otherwise."""
    def add_done_callback(self, fn: Callable[[Optional[BaseException]], None]) -> None:
        """Calls `fn(None)` or `fn(error)` once the Work completes (at once if it has), on the
        engine's thread with the GIL held."""

class ProcessGroup:
    """A group of ranks with its own TCP mesh and worker thread. Construction is collective:
    every rank of the group constructs it with the same `store` and `group_name`."""

    def __init__(
        self,
        store: object,
        rank: int,
        size: int,
        timeout: float,
        group_name: str,
    ) -> None:
        """`store` is a rustdist Store or any object with torch's Store methods (set/get/...)."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def group_name(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    def all_reduce(self, ptr: int, numel: int, dtype: int, op: int, keep: object) -> Work: ...
    def broadcast(self, ptr: int, numel: int, dtype: int, root: int, keep: object) -> Work: ...
    def all_gather(
        self, in_ptr: int, out_ptrs: Sequence[int], numel: int, dtype: int, keep: object
    ) -> Work:
        """`out_ptrs[r]` receives rank r's `numel` elements (own block included)."""
    def reduce_scatter(
        self, in_ptr: int, out_ptr: int, numel: int, dtype: int, op: int, keep: object
    ) -> Work:
        """Input holds size*numel elements; rank r gets the reduction of block r."""
    def barrier(self) -> Work: ...
    def send(self, ptr: int, numel: int, dtype: int, dst: int, tag: int, keep: object) -> Work: ...
    def recv(
        self, ptr: int, numel: int, dtype: int, src: Optional[int], tag: int, keep: object
    ) -> Work: ...
    def shutdown(self) -> None:
        """Leaves the group cleanly: waits for queued work, tells peers, closes sockets."""
    def abort(self) -> None:
        """Fails queued work and tells peers the group is aborted."""
