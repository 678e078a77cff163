"""Type stubs for rustdist._core, the PyO3 extension (thin wrappers over rustdist-core).

Tensors cross this boundary zero-copy as (data pointer, element count, dtype code); the
`keep` argument is any Python object (usually a tuple of the tensors) that the engine holds
until the Work completes, so the memory stays alive while the engine uses it.

Dtype codes: float32=0 float64=1 float16=2 bfloat16=3 int8=4 int16=5 int32=6 int64=7
uint8=8 bool=9 complex64=10 complex128=11.
Reduce-op codes: SUM=0 PRODUCT=1 MIN=2 MAX=3 BAND=4 BOR=5 BXOR=6 AVG=7 PREMUL_SUM=8.
Timeouts are float seconds.
"""

import datetime
from types import ModuleType
from typing import Any, Callable, Optional, Sequence, Union

__version__: str

class Store:
    """Base class of every store (torch.distributed.Store); not constructible itself.

    Keys are str; values are given as str, bytes or bytearray and returned as bytes.
    Timeouts are given as datetime.timedelta (as torch) or float seconds, and reported as
    datetime.timedelta. Blocking calls release the GIL; one store object may be used from
    several threads at once. A timeout raises rustdist._errors.DistStoreError (a subclass
    of torch.distributed.DistStoreError) naming the missing keys.
    """

    def set(self, key: str, value: str | bytes | bytearray) -> None:
        """Inserts `key` with `value`, replacing any old value."""
    def get(self, key: str) -> bytes:
        """The value of `key`, waiting up to `timeout` for it to be set."""
    def add(self, key: str, value: int) -> int:
        """Adds `value` to the integer counter at `key` (created at 0); returns the new
        value. Raises DistStoreError naming the key when it holds a non-integer."""
    def append(self, key: str, value: str | bytes | bytearray) -> None:
        """Appends `value` to the value of `key`, creating it when absent."""
    def check(self, keys: Sequence[str]) -> bool:
        """True when every key is set; does not wait."""
    def compare_set(
        self,
        key: str,
        expected_value: str | bytes | bytearray,
        desired_value: str | bytes | bytearray,
    ) -> bytes:
        """Sets `desired_value` when the value equals `expected_value` (or the key is absent
        and `expected_value` is empty); returns the value now held (`expected_value` when
        the key is absent and nothing was set)."""
    def delete_key(self, key: str) -> bool:
        """Deletes `key`; True when it existed."""
    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """The values of `keys`, waiting up to `timeout` for all of them."""
    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes | bytearray]) -> None: ...
    def num_keys(self) -> int:
        """Keys set (no internal keys are counted: a fresh TCPStore has 0, torch's 1)."""
    def wait(
        self, keys: Sequence[str], timeout: Optional[datetime.timedelta | float] = None
    ) -> None:
        """Waits until every key is set, up to `timeout` (default: the store's)."""
    def set_timeout(self, timeout: datetime.timedelta | float) -> None: ...
    @property
    def timeout(self) -> datetime.timedelta: ...

class TCPStore(Store):
    """A store served by the master over TCP. `port=0` on the master binds a free port.
    With `world_size` and `wait_for_workers`, the master's constructor waits until
    world_size stores (itself included) have connected. Clients retry connecting until
    `timeout` (DistNetworkError then). `multi_tenant`: masters of one process on one port
    share a server. `master_listen_fd`: serve on this listening socket (duplicated).
    `use_libuv` is accepted and ignored. The server stops when the master is destroyed."""

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: Optional[int] = None,
        is_master: bool = False,
        timeout: datetime.timedelta | float = datetime.timedelta(seconds=300),
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
    """A store shared by processes through a file. With `world_size > 0` the file is
    deleted once that many FileStore objects using it have been destroyed."""

    def __init__(self, file_name: str, world_size: int = -1) -> None: ...
    @property
    def path(self) -> str: ...

class HashStore(Store):
    """A store within one process."""

    def __init__(self) -> None: ...

class PrefixStore(Store):
    """Adds `prefix + "/"` to every key of `store` (a rustdist store, or any object with
    torch's Store methods, e.g. a torch.distributed.TCPStore)."""

    def __init__(self, prefix: str, store: object) -> None: ...
    @property
    def underlying_store(self) -> object: ...

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

def join(
    works: list[Work],
    copies: list[tuple[int, int, int]] = ...,
    keep: Optional[object] = None,
) -> Work:
    """One Work for ``works``, completed once all are (with the first error among them); on
    success it first copies each ``(source pointer, destination pointer, bytes)`` of
    ``copies`` in order. ``keep`` is held until then."""

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
    def timeout(self) -> float:
        """The timeout (seconds) operations issued now get."""
    def set_timeout(self, timeout: float) -> None:
        """Sets the timeout (seconds) of the operations issued after this call, point-to-point
        ones and monitored_barrier's grace included; those issued before keep theirs.
        ValueError for a negative or NaN value."""
    @property
    def link(self) -> str:
        """How the ranks reach each other: "shm", "tcp" or "hierarchical"."""
    @property
    def supports_window(self) -> bool:
        """Whether the group can hold one-sided windows: always (UNIFIED on one host with
        shared memory, SEPARATE elsewhere)."""
    @property
    def link_model(self) -> tuple[float, int]:
        """The TCP link model algorithm selection uses: (one-way latency in seconds, bytes
        per second), from RUSTDIST_LINK_LATENCY_US / RUSTDIST_LINK_BANDWIDTH, else measured
        between hosts at connect, else the reference loopback's."""
    @property
    def streams_per_peer(self) -> int:
        """TCP streams joining this rank to each peer on another host (1 when none is):
        RUSTDIST_STREAMS_PER_PEER, else as many as keep the link's round trip in flight."""
    def stats(self) -> str:
        """The group's counters on this rank, as JSON: ``ops`` (by operation: ``count``,
        ``bytes``), ``algorithms`` (by "collective/algorithm": collectives run), ``waited_s``
        (seconds the transport slept waiting for peers)."""
    @property
    def sequence_number(self) -> int:
        """The sequence number of the last collective issued on the group (0 before any), as
        the flight recorder numbers them."""
    @property
    def status_address(self) -> str | None:
        """Where this rank answers status queries ("host:port" of its heartbeats' socket);
        None alone in its group or with heartbeats off."""
    # Every collective runs asynchronously and returns a Work, or with `sync=True` returns
    # None once done (on the calling thread when the group is idle).
    def all_reduce(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        op: int,
        keep: object,
        premul: Optional[float] = None,
        sync: bool = False,
    ) -> Optional[Work]:
        """In-place all_reduce; `premul` is PREMUL_SUM's factor."""
    def reduce(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        op: int,
        root: int,
        keep: object,
        premul: Optional[float] = None,
        sync: bool = False,
    ) -> Optional[Work]:
        """Result on `root`; the other ranks' tensors are left unchanged."""
    def broadcast(
        self, ptr: int, numel: int, dtype: int, root: int, keep: object, sync: bool = False
    ) -> Optional[Work]: ...
    def all_gather(
        self,
        in_ptr: int,
        outputs: Union[int, Sequence[int]],
        numel: int,
        dtype: int,
        keep: object,
        sync: bool = False,
    ) -> Optional[Work]:
        """`outputs[r]` receives rank r's `numel` elements (own block included); an int is
        the base of one buffer holding the blocks in rank order."""
    def reduce_scatter(
        self,
        in_ptr: int,
        out_ptr: int,
        numel: int,
        dtype: int,
        op: int,
        keep: object,
        premul: Optional[float] = None,
        sync: bool = False,
    ) -> Optional[Work]:
        """Input holds size*numel elements; rank r gets the reduction of block r."""
    def exchange(
        self,
        kind: str,
        dtype: int,
        count: int,
        sends: Union[int, Sequence[tuple[int, int, int]]],
        recvs: Union[int, Sequence[tuple[int, int, int]]],
        keep: object,
        sync: bool = False,
    ) -> Optional[Work]:
        """gather, scatter, all_to_all, or all_gather of blocks of different sizes (`kind`):
        the blocks this rank sends and receives, each (peer, data pointer, numel), or as an
        int the base of one buffer with a block of `count` elements per rank. `count` is a
        number every rank agrees on, or 0 when sizes differ (lengths are checked)."""
    def monitored_barrier(self, timeout: float, wait_all_ranks: bool) -> Work:
        """Rank 0 waits `timeout` seconds for every rank and fails naming the missing ones."""
    def barrier(self, sync: bool = False) -> Optional[Work]: ...
    def send(self, ptr: int, numel: int, dtype: int, dst: int, tag: int, keep: object) -> Work: ...
    def recv(
        self, ptr: int, numel: int, dtype: int, src: Optional[int], tag: int, keep: object
    ) -> Work: ...
    def shutdown(self) -> None:
        """Leaves the group cleanly: waits for queued work, tells peers, closes sockets."""
    def abort(self) -> None:
        """Fails queued work and tells peers the group is aborted."""
    def shrink(self, excluded: list[int], abort_pending: bool) -> ProcessGroup:
        """The group of this one's ranks but `excluded` (sorted, without this rank), renumbered
        in order, over the same links; every other rank calls it. `abort_pending` aborts
        pending operations first, else they are an error (unless the group has failed). This
        group refuses work afterwards."""
    def error(self) -> Optional[Exception]:
        """The error that failed the group, or None while it works."""
    def forget_rendezvous(self, store: Any) -> None:
        """Deletes from `store` (the group's) the keys this rank published while connecting,
        after a barrier. Collective."""
    def retire(self, reason: str) -> None:
        """Leaves a group a reconfigure replaced: pending and later operations fail with
        `reason`; returns once its worker has finished."""
    def wait_failed(self, timeout: float) -> Optional[Exception]:
        """Waits up to `timeout` seconds for the group to fail: the error, else None."""
    @property
    def hooked(self) -> bool:
        """Whether collective hooks are registered (the fast path leaves the group to
        Python, which fires them)."""
    def set_hooked(self, hooked: bool) -> None:
        """Sets :attr:`hooked`."""
    def set_trace_info(self, name: str, desc: str, ranks: list[int]) -> None:
        """Names the group in its flight recorder as torch knows it: `name` (torch's
        group_name), `desc` (group_desc), the members' global ranks by group rank."""

class Window:
    """A one-sided window registered on every rank of a group: each rank's registered bytes
    in shared memory every rank of the host maps (UNIFIED access, one host with shared
    memory), or reached by frames on the links that the owner's engine applies (SEPARATE)."""

    @staticmethod
    def register(
        group: ProcessGroup, ptr: int, nbytes: int, meta: bytes
    ) -> tuple[Window, list[bytes]]:
        """Registers the `nbytes` bytes at `ptr` (copied in) as this rank's window memory
        (collective); returns the window and every rank's `meta` (at most 183 bytes)."""
    @property
    def unified(self) -> bool:
        """Whether peers' memories are mapped here (UNIFIED) rather than reached over the
        links (SEPARATE)."""
    def address(self, rank: int) -> int:
        """Where rank `rank`'s registered bytes are mapped in this process (RuntimeError for a
        peer's with SEPARATE access)."""
    def nbytes(self, rank: int) -> int:
        """How many bytes rank `rank` registered."""
    def set_targets(self, targets: list[tuple[int, int, int]]) -> None:
        """Sets every rank's (element count, dtype code, bytes per element), which
        :meth:`put_now` checks puts against; once."""
    def put_now(self, obj: object, dst: int, offset: int) -> bool:
        """A synchronous put of `obj` (a plain contiguous CPU torch tensor, or a
        C-contiguous buffer such as a numpy array) into rank `dst`'s window at element
        `offset`, without the Python layer; False, having done nothing, when the call is not
        that simple or its checks fail (the Python layer then runs it, or raises)."""
    def deregister(self) -> None:
        """Ends the registration on every rank (collective): puts into it fail after."""
    def put(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        dst: int,
        offset_bytes: int,
        keep: object,
        sync: bool = False,
    ) -> Optional[Work]:
        """Copies the tensor at `ptr` into rank `dst`'s window at byte `offset_bytes`, in
        issue order with the group's operations (recorded as "put")."""
    def signal(self, dst: int, sync: bool = False) -> Optional[Work]:
        """Signals rank `dst`, after every put this rank issued before."""
    def wait_signal(
        self, src: int, timeout: Optional[float] = None, sync: bool = False
    ) -> Optional[Work]:
        """Waits for rank `src`'s next signal within `timeout` seconds (None: the group's);
        raises naming `src` on a timeout, and the group's error if it fails meanwhile."""

def flight_recorder_set_rank(rank: int) -> None:
    """Sets this process's global rank, which names its flight recorder dump."""

def flight_recorder_dump(prefix: Optional[str] = None) -> str:
    """Writes every group's flight recorder, in torch's pickle format, to `prefix` (default
    TORCH_FR_DUMP_TEMP_FILE, else /tmp/nccl_trace_rank_) followed by the global rank; returns
    the path."""

def flight_recorder_dump_after(why: str) -> None:
    """Dumps as after a failure (`why` is logged), when recording is on and the rank is known;
    never raises."""

def flight_recorder_capacity() -> int:
    """Entries each group keeps (TORCH_FR_BUFFER_SIZE, default 128; 0: recording off)."""

def ask_status(addrs: list[str], timeout: float) -> list[str | None]:
    """Asks the ranks whose heartbeats answer at ``addrs`` ("host:port") what their processes
    are doing; each answer (JSON) by position, None where none came within ``timeout``
    seconds. Signs the queries with RUSTDIST_AUTH_KEY when it is set."""

def selection_table(
    worlds: Sequence[int], sizes: Sequence[int]
) -> list[tuple[str, str, int, int, str]]:
    """The algorithm the engine picks per (collective, link kind, world size, bytes) with
    RUSTDIST_ALGO applied: rows (collective, link, world, bytes, algorithm); link is "shm"
    (every rank on one host), "tcp" or "hierarchical"."""

def fast_init(
    tensor: type,
    dtype_codes: dict[object, int],
    sum: object,
    op_class: type,
    api: ModuleType,
    group_class: type,
    debug: ModuleType,
    log: Callable[[str, BaseException], None],
    profiler: ModuleType,
    work: Callable[[Work, list[Any]], object],
    handed_work: Callable[[Work, list[Any]], object],
) -> None:
    """Sets up the fast functions (once): torch.Tensor, dtype -> code, ReduceOp.SUM and ReduceOp, the
    distributed_c10d module (its `_default_pg`) and its ProcessGroup class, the _debug module
    (its `detail` flag), the logger of failed calls, torch.autograd.profiler (its
    `_is_profiler_enabled` flag: while a profiler records, calls take the Python path), and
    what an asynchronous call returns, made from the engine's Work and the output tensors:
    `work` for the fast functions, `handed_work` for the group's methods."""

def fast_function(
    name: str, python: Callable[..., object], module: str, doc: str, method: bool = False
) -> Callable[..., object]:
    """The fast function of `name` (all_reduce, broadcast, all_gather_into_tensor,
    reduce_scatter_tensor, all_to_all_single or barrier): a builtin (vectorcall, no argument
    tuple or dict) that runs the usual call (synchronous, or with `async_op=True`) on a plain
    contiguous CPU tensor with SUM on a rustdist group directly and hands every other call to
    `python`; `__module__` is `module`, and `doc` its docstring, whose first lines may give
    the signature (`name(params)\n--\n\n`). With `method`, `name` is a method of rustdist's
    torch ProcessGroup that torch's calls reach (allreduce, broadcast, _allgather_base,
    _reduce_scatter_base or barrier) and the builtin is called with the group first: torch's
    usual synchronous call (`opts.asyncOp` False) runs directly and returns None, an
    asynchronous one returns its Work."""

def cuda_buffer(x: object) -> Optional[tuple[int, int, int, int]]:
    """(data pointer, element count, dtype code, device index) of `x` when it is a plain
    contiguous CUDA tensor of a real dtype, read through torch's DLPack exchange API (torch
    2.10 and later); None otherwise, where the caller's own checks take over."""


# ---------------------------------------------------------------------------------------------
# CUDA (NCCL, and host-staged where NCCL cannot). CUDA tensors cross as (device pointer,
# element count, dtype code); `stream` is the caller's current stream as a raw cudaStream_t
# (`torch.cuda.current_stream().cuda_stream`); `keep` is held until the GPU work has finished.
# `search_dirs` are folders to look for libnccl.so.2 / libcudart.so.{13,12} in first (torch's
# nvidia wheels), before RUSTDIST_NCCL_LIBRARY / RUSTDIST_CUDART_LIBRARY and the system.

def cuda_nccl_version(search_dirs: Sequence[str]) -> tuple[int, int, int]:
    """(major, minor, patch) of the NCCL that loads; raises RuntimeError naming every file
    tried when none does."""
def cuda_nccl_unique_id(search_dirs: Sequence[str]) -> bytes:
    """A fresh 128-byte ncclUniqueId (needs no GPU: NCCL only opens its bootstrap listener);
    RuntimeError when NCCL cannot be loaded or fails."""
def cuda_is_available(search_dirs: Sequence[str]) -> bool:
    """True when libcudart loads and sees a device."""
def cuda_load_report(search_dirs: Sequence[str] = ()) -> dict[str, object]:
    """{"nccl": {"path", "version"} or {"error"}, "cudart": the same, "driver_version":
    (major, minor, patch) or None, "device_count": int or why not}."""

class CudaWork:
    """A CUDA operation (torch's WorkNCCL). Its `work` (a `_core.Work`) completes, releasing
    `keep`, once the GPU work has finished; callbacks and futures hang off it."""

    def wait(self, stream: int) -> bool:
        """Makes `stream` wait on the device for the operation's end (no host block, except
        for an operation queued behind a host-staged one, until it is enqueued); raises the
        operation's error if it has already failed."""
    def synchronize(self, timeout: Optional[float] = None) -> bool:
        """Blocks (GIL released) until the operation has finished on the device; raises its
        error, or DistBackendError when `timeout` passes first."""
    def is_completed(self) -> bool:
        """Whether the GPU work has finished (cudaEventQuery)."""
    def is_success(self) -> bool: ...
    def exception(self) -> Optional[BaseException]: ...
    def source_rank(self) -> int:
        """Sender's rank for a completed receive; raises RuntimeError otherwise."""
    def add_done_callback(self, fn: Callable[[Optional[BaseException]], None]) -> None:
        """Calls `fn(None)` or `fn(error)` once the GPU work has finished (on the watchdog
        thread, with the GIL held)."""
    @property
    def work(self) -> Work: ...

class CudaGroup:
    """The CUDA side of a process group on one device. Construction is collective: ranks
    exchange their GPU (host + PCI bus id) through `store`; distinct GPUs get a non-blocking
    NCCL communicator (bounded by `timeout`), a shared GPU makes every operation staged
    through pinned host memory on `pg` (which must serve nothing else). Raises RuntimeError
    naming the reason when CUDA or NCCL is unavailable, ValueError for a bad device."""

    def __init__(
        self,
        pg: ProcessGroup,
        store: object,
        rank: int,
        size: int,
        timeout: float,
        group_name: str,
        device: int,
        search_dirs: Sequence[str] = (),
    ) -> None: ...
    @property
    def mode(self) -> str:
        """"nccl", or "staged" (ranks share a GPU)."""
    @property
    def device(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def timeout(self) -> float:
        """The timeout (seconds) CUDA operations issued now get."""
    def set_timeout(self, timeout: float) -> None:
        """Sets the timeout (seconds) of the CUDA operations issued after this call (the
        watchdog's bound), of the communicator's later calls and of the staging group; those
        issued before keep theirs. ValueError for a negative or NaN value."""
    def all_reduce(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        op: int,
        stream: int,
        keep: object,
        premul: Optional[float] = None,
    ) -> CudaWork: ...
    def reduce(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        op: int,
        root: int,
        stream: int,
        keep: object,
        premul: Optional[float] = None,
    ) -> CudaWork:
        """Result on `root`; the other ranks' tensors are left unchanged."""
    def broadcast(
        self, ptr: int, numel: int, dtype: int, root: int, stream: int, keep: object
    ) -> CudaWork: ...
    def all_gather(
        self,
        in_ptr: int,
        numel: int,
        dtype: int,
        outputs: Sequence[tuple[int, int]],
        stream: int,
        keep: object,
    ) -> CudaWork:
        """`outputs[r] = (pointer, numel)` receives rank r's input; sizes may differ."""
    def all_gather_into(
        self, in_ptr: int, out_ptr: int, numel: int, dtype: int, stream: int, keep: object
    ) -> CudaWork:
        """The output holds size * numel elements (flat or stacked)."""
    def reduce_scatter(
        self,
        in_ptrs: Sequence[int],
        out_ptr: int,
        numel: int,
        dtype: int,
        op: int,
        stream: int,
        keep: object,
        premul: Optional[float] = None,
    ) -> CudaWork:
        """`in_ptrs[r]` (numel elements each) is reduced into rank r's output."""
    def reduce_scatter_tensor(
        self,
        in_ptr: int,
        out_ptr: int,
        numel: int,
        dtype: int,
        op: int,
        stream: int,
        keep: object,
        premul: Optional[float] = None,
    ) -> CudaWork:
        """The input holds size * numel elements, the output numel."""
    def exchange(
        self,
        kind: str,
        dtype: int,
        count: int,
        sends: Union[int, Sequence[tuple[int, int, int]]],
        recvs: Union[int, Sequence[tuple[int, int, int]]],
        stream: int,
        keep: object,
    ) -> CudaWork:
        """Concurrent transfers (peer, pointer, numel), or as an int the base of one buffer with
        a block of `count` elements per rank, for gather, scatter, all_to_all(_single): grouped
        NCCL send/recv (copies to self on the device). `kind` names the collective,
        `count` is what every rank agrees on (0 when sizes differ)."""
    def send(
        self, ptr: int, numel: int, dtype: int, dst: int, tag: int, stream: int, keep: object
    ) -> CudaWork:
        """NCCL for tag 0, host memory otherwise (the receiver routes its tag the same way)."""
    def recv(
        self,
        ptr: int,
        numel: int,
        dtype: int,
        src: Optional[int],
        tag: int,
        stream: int,
        keep: object,
    ) -> CudaWork:
        """`src=None` (any source) needs a nonzero tag when the group has NCCL."""
    def batch_isend_irecv(
        self,
        ops: Sequence[tuple[bool, int, int, int, int, int]],
        stream: int,
        keep: object,
    ) -> CudaWork:
        """`ops` are (is_send, peer, pointer, numel, dtype, tag); one Work for them all."""
    def barrier(self, stream: int) -> CudaWork:
        """A one-element all_reduce on the device (host-staged: the CPU barrier)."""
    def split(
        self, member: Optional[tuple[ProcessGroup, object, int, int, float, str]]
    ) -> Optional[CudaGroup]:
        """A subgroup: `member` is (pg, store, rank, size, timeout, group_name) on members,
        None elsewhere. Collective over every rank of this group when it has NCCL
        (ncclCommSplit), else over the members only."""
    def set_trace_info(self, name: str, desc: str, ranks: list[int]) -> None:
        """Names the group in its flight recorder (see ProcessGroup.set_trace_info)."""
    @property
    def can_shrink(self) -> bool:
        """Whether `shrink` can run: a staged group, or NCCL with ncclCommShrink (>= 2.27)."""
    def shrink(self, excluded: list[int], abort_pending: bool, name: str) -> CudaGroup:
        """The group of this one's ranks but `excluded`, renumbered in order (ncclCommShrink
        and the staging group's shrink); this group is aborted afterwards."""
    def shutdown(self) -> None:
        """Pending work finishes (bounded by the timeout), then ncclCommFinalize/Destroy."""
    def abort(self) -> None:
        """ncclCommAbort; pending and later operations fail with DistBackendError."""
