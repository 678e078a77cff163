"""CUDA tensors: NCCL (and, where NCCL cannot, host memory) with torch's stream semantics.

The per-op functions take a rustdist ``ProcessGroup`` (``group``) and CUDA tensors, and behave
as ``torch.distributed`` with the NCCL backend does: each operation is enqueued on the group's
internal stream after the work already queued on the caller's current stream, and the call
returns once it is enqueued. ``async_op=False`` then makes the current stream wait for the
operation (the host does not block); ``async_op=True`` returns a :class:`CudaWork` whose
``wait()`` does that. Group ranks are used throughout (``dst``, ``src``: group ranks).

NCCL and the CUDA runtime are loaded at run time from torch's ``nvidia`` wheels
(:func:`library_paths`), then ``RUSTDIST_NCCL_LIBRARY`` / ``RUSTDIST_CUDART_LIBRARY``, then the
system, so ``import rustdist`` works on machines without CUDA.

What NCCL cannot do runs through pinned host memory on the CPU engine: int16 reductions,
BAND/BOR/BXOR on integers (BXOR on bool), complex PRODUCT, send/recv with a nonzero tag (on
both sides, so they match), recv from any source (nonzero tag), and every operation of a
group whose ranks share a GPU.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta
from typing import Any, Optional, Sequence, Union

from . import _core
from ._tensor import ITEMSIZE, dim0, torch_code
from ._work import Work, seconds

#: Sub-folders of torch's ``nvidia`` wheel package that hold libnccl and libcudart (CUDA 13
#: wheels: nccl/lib and cu13/lib; CUDA 12 wheels: nccl/lib and cuda_runtime/lib or cu12/lib).
_WHEEL_DIRS = ("nccl/lib", "cu13/lib", "cuda_runtime/lib", "cu12/lib")


def library_paths() -> list[str]:
    """The folders of the installed ``nvidia`` wheels (torch's dependencies) that hold NCCL
    and the CUDA runtime, in search order; empty when none is installed."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    found: list[str] = []
    for root in roots:
        for sub in _WHEEL_DIRS:
            path = os.path.join(root, sub)
            if os.path.isdir(path) and path not in found:
                found.append(path)
    return found


def nccl_version() -> tuple[int, int, int]:
    """The version of the NCCL rustdist loads, as torch's
    ``torch.cuda.nccl.version()`` reports it: ``(major, minor, patch)``. Raises
    ``RuntimeError`` saying why when NCCL cannot be loaded."""
    return _core.cuda_nccl_version(library_paths())


def nccl_unique_id() -> bytes:
    """A fresh ``ncclUniqueId`` (128 bytes, like ``torch.cuda.nccl.unique_id()``); needs no
    GPU. Raises ``RuntimeError`` when NCCL cannot be loaded."""
    return _core.cuda_nccl_unique_id(library_paths())


def is_available() -> bool:
    """True when the CUDA runtime loads and sees at least one GPU (like
    ``torch.cuda.is_available()``)."""
    return _core.cuda_is_available(library_paths())


def load_report() -> dict[str, Any]:
    """What was loaded: ``{"nccl": {"path", "version"} or {"error"}, "cudart": likewise,
    "driver_version": (major, minor, patch) or None, "device_count": int or why none}``."""
    return _core.cuda_load_report(library_paths())


class CudaWork(Work):
    """The handle of a CUDA operation (torch's ``WorkNCCL``): ``wait()`` makes the current
    CUDA stream wait for it, ``is_completed()`` asks the device, and ``get_future()`` completes
    (with ``result()``) once the GPU work has finished."""

    __slots__ = ("_device",)

    def __init__(self, work: Any, outputs: list[Any], device: int) -> None:
        super().__init__(work, outputs)
        self._device = device

    def wait(self, timeout: Optional[Union[timedelta, float]] = None) -> bool:
        """Makes the current CUDA stream wait for the operation (the host does not block) and
        returns True; raises the operation's error if it has failed. With a ``timeout``, also
        blocks the host until the operation is done, raising ``DistBackendError`` once the
        timeout passes (torch's blocking wait)."""
        self._work.wait(_current_stream(self._device))
        if timeout:
            self._work.synchronize(seconds(timeout))
        return True

    def synchronize(self) -> None:
        """Makes the current CUDA stream wait for the operation (torch's
        ``Work.synchronize()`` for NCCL)."""
        self._work.wait(_current_stream(self._device))

    def _synchronize_host(self, timeout: Optional[float] = None) -> None:
        self._work.synchronize(timeout)


class _StagedWork(CudaWork):
    """A CUDA operation run on private buffers for tensors that share memory (see
    ``rustdist._alias``): waiting for it also copies them back into the call's tensors, in the
    call's order, on the current stream."""

    __slots__ = ("_back",)

    def __init__(self, work: CudaWork, back: list[tuple[Any, Any]], outputs: list[Any]) -> None:
        super().__init__(work._work, outputs, work._device)
        self._back = back

    def wait(self, timeout: Optional[Union[timedelta, float]] = None) -> bool:
        """As ``CudaWork.wait``, then the copies back (once)."""
        super().wait(timeout)
        self._copy_back()
        return True

    def synchronize(self) -> None:
        """As ``CudaWork.synchronize``, then the copies back (once)."""
        super().synchronize()
        self._copy_back()

    def _copy_back(self) -> None:
        back, self._back = self._back, []
        for staged_buffer, tensor in back:
            tensor.copy_(staged_buffer)


def staged(works: list[CudaWork], back: list[tuple[Any, Any]], outputs: list[Any],
           async_op: bool) -> Optional[CudaWork]:
    """The Work of a call run on private buffers (``works``: its operations, in the order the
    group's internal stream runs them); synchronous: waited for, copies done, None."""
    work = _StagedWork(works[-1], back, outputs)
    if async_op:
        return work
    work.wait()
    return None


def _current_stream(device: int) -> int:
    from ._torch_private import current_raw_stream

    return current_raw_stream(device)


def _buffer(x: Any, name: str) -> tuple[int, int, int, int]:
    """(data pointer, element count, dtype code, device index) of a contiguous CUDA tensor;
    raises what torch raises otherwise, naming ``name``."""
    read = _core.cuda_buffer(x)  # one DLPack call for the usual tensor
    if read is not None:
        return read
    is_cuda = getattr(x, "is_cuda", None)
    if is_cuda is None:
        raise TypeError(
            f"Invalid function argument. Expected parameter `{name}` of type torch.Tensor "
            f"but got {type(x)} instead."
        )
    if not is_cuda:
        raise RuntimeError(f"`{name}` must be a CUDA tensor, it is on {x.device}")
    code = torch_code(x, name)
    if not x.is_contiguous():  # torch's ValueError and text (ProcessGroupNCCL's check)
        raise ValueError(f"Tensors must be contiguous: `{name}` is not (.contiguous() makes "
                         "a contiguous copy)")
    return x.data_ptr(), x.numel(), code, x.get_device()


def _device_of(tensors: Sequence[Any]) -> int:
    return _one_device([t.get_device() for t in tensors])


def _one_device(devices: Sequence[int]) -> int:
    """The device of every tensor of an operation, given their device indices."""
    first = devices[0]
    for d in devices:
        if d != first:
            raise ValueError(f"tensors of one operation must be on one CUDA device, got "
                             f"{set(devices)}")
    return first


def _member_args(pg: Any) -> tuple[Any, Any, int, int, float, str]:
    """What ``_core.CudaGroup`` takes for rustdist group ``pg``: a CPU group of its own for the
    host-staged steps (so that they cannot interleave with ``pg``'s CPU operations differently
    on different ranks), the store, rank, size, timeout and name. Collective over ``pg``."""
    store = _core.PrefixStore("cuda", pg._store)
    timeout = pg._pg.timeout
    staging = _core.ProcessGroup(_core.PrefixStore("staging", store), pg._rank, pg._size,
                                 timeout, f"{pg.group_name}/cuda-staging")
    return staging, store, pg._rank, pg._size, timeout, pg.group_name


def _cuda_group(pg: Any, device: int) -> Any:
    """The ``_core.CudaGroup`` of rustdist group ``pg`` on ``device``, created on first use
    (collective over the group's ranks: every rank's first CUDA operation on ``pg``)."""
    cuda = getattr(pg, "_cuda", None)
    if cuda is None:
        cuda = _core.CudaGroup(*_member_args(pg), device, library_paths())
        pg._cuda = cuda
        pg._trace_as(*pg._trace)
    elif cuda.device != device:
        raise ValueError(
            f"process group {pg.group_name!r} runs its CUDA operations on cuda:{cuda.device}; "
            f"got a tensor on cuda:{device} (one device per process and group, as torch's NCCL)"
        )
    return cuda


def new_subgroup(parent: Any, child: Optional[Any]) -> None:
    """Call on every rank of ``parent`` when a subgroup is created (``new_group``), with the
    new rustdist group on its members and None elsewhere. When ``parent`` already has an NCCL
    communicator, the subgroup's is split from it (ncclCommSplit: collective over every rank
    of ``parent``, cheaper than a fresh init); otherwise nothing happens here and the subgroup
    creates its own on its first CUDA operation."""
    cuda = getattr(parent, "_cuda", None)
    if cuda is None or cuda.mode != "nccl":
        return
    sub = cuda.split(None if child is None else _member_args(child))
    if child is not None:
        child._cuda = sub
        child._trace_as(*child._trace)


def check_shrink(pg: Any) -> None:
    """Raises, before anything changes, when ``pg``'s CUDA group cannot shrink (its NCCL has
    no ncclCommShrink: NCCL < 2.27)."""
    cuda = getattr(pg, "_cuda", None)
    if cuda is not None and not cuda.can_shrink:
        major, minor, patch = nccl_version()
        raise RuntimeError(
            f"shrink_group on a group with CUDA tensors needs NCCL >= 2.27 (ncclCommShrink); "
            f"the NCCL loaded is {major}.{minor}.{patch}"
        )


def shrink(parent: Any, child: Any, excluded: list[int], abort_pending: bool) -> None:
    """Shrinks ``parent``'s CUDA group, if it has one, into ``child`` (the shrunk rustdist
    group): ncclCommShrink for its communicator, its own shrink for the staging group.
    ``parent``'s is aborted afterwards, as NCCL asks of a shrunk communicator."""
    cuda = getattr(parent, "_cuda", None)
    if cuda is not None:
        child._cuda = cuda.shrink(excluded, abort_pending, child.group_name)
        child._trace_as(*child._trace)
        parent._cuda = None


def shutdown(pg: Any) -> None:
    """Finalizes ``pg``'s CUDA group, if it has one (``destroy_process_group``): pending
    operations finish (bounded by the group's timeout), then the NCCL communicator and the
    staging group are released."""
    cuda = getattr(pg, "_cuda", None)
    if cuda is not None:
        cuda.shutdown()
        pg._cuda = None


def abort(pg: Any) -> None:
    """Aborts ``pg``'s CUDA group, if it has one: pending and later CUDA operations fail with
    ``DistBackendError``."""
    cuda = getattr(pg, "_cuda", None)
    if cuda is not None:
        cuda.abort()


def _finish(work: Any, outputs: list[Any], device: int, async_op: bool) -> Optional[CudaWork]:
    if async_op:
        return CudaWork(work, outputs, device)
    work.wait(_current_stream(device))  # what CudaWork.wait does, without building one
    return None


def all_reduce(group: Any, tensor: Any, op_code: int, premul: Optional[float] = None,
               async_op: bool = False) -> Optional[CudaWork]:
    """Reduces ``tensor`` across the group in place with the reduction ``op_code`` (a
    ``_core`` op code; ``premul`` is PREMUL_SUM's factor)."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    work = _cuda_group(group, dev).all_reduce(ptr, n, code, op_code, _current_stream(dev),
                                              (tensor,), premul)
    return _finish(work, [tensor], dev, async_op)


def reduce(group: Any, tensor: Any, dst: int, op_code: int, premul: Optional[float] = None,
           async_op: bool = False) -> Optional[CudaWork]:
    """Reduces ``tensor`` of every rank into ``tensor`` on group rank ``dst``; the other
    ranks' tensors are left unchanged."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    work = _cuda_group(group, dev).reduce(ptr, n, code, op_code, dst, _current_stream(dev),
                                          (tensor,), premul)
    return _finish(work, [tensor], dev, async_op)


def broadcast(group: Any, tensor: Any, src: int, async_op: bool = False) -> Optional[CudaWork]:
    """Broadcasts ``tensor`` from group rank ``src`` to the whole group, in place."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    work = _cuda_group(group, dev).broadcast(ptr, n, code, src, _current_stream(dev), (tensor,))
    return _finish(work, [tensor], dev, async_op)


def all_gather(group: Any, tensor_list: Sequence[Any], tensor: Any,
               async_op: bool = False) -> Optional[CudaWork]:
    """Gathers every rank's ``tensor`` into ``tensor_list`` (one per rank, of that rank's size:
    sizes may differ by rank)."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    outs = [_buffer(t, "tensor_list") for t in tensor_list]
    if any(o[2] != code for o in outs):
        raise ValueError("all_gather: every tensor in tensor_list must have the input's dtype")
    _device_of([tensor, *tensor_list])
    work = _cuda_group(group, dev).all_gather(ptr, n, code, [(o[0], o[1]) for o in outs],
                                              _current_stream(dev), (tensor, list(tensor_list)))
    return _finish(work, list(tensor_list), dev, async_op)


def all_gather_into_tensor(group: Any, output_tensor: Any, input_tensor: Any,
                           async_op: bool = False) -> Optional[CudaWork]:
    """Gathers every rank's ``input_tensor`` into ``output_tensor`` (world_size times its
    size, flat or stacked along a new first dimension)."""
    ptr, n, code, dev = _buffer(input_tensor, "input_tensor")
    out, out_n, out_code, out_dev = _buffer(output_tensor, "output_tensor")
    _one_device([dev, out_dev])
    if out_code != code or out_n != n * group._size:
        raise ValueError(
            f"all_gather_into_tensor: output_tensor must have world_size ({group._size}) times "
            f"the input's {n} elements of {input_tensor.dtype}, got {out_n} of "
            f"{output_tensor.dtype}"
        )
    work = _cuda_group(group, dev).all_gather_into(ptr, out, n, code, _current_stream(dev),
                                                   (input_tensor, output_tensor))
    return _finish(work, [output_tensor], dev, async_op)


def _exchange(group: Any, kind: str, dtype_code: int, count: int,
              sends: list[tuple[int, Any]], recvs: list[tuple[int, Any]], keep: Any,
              outputs: list[Any], async_op: bool) -> Optional[CudaWork]:
    """One step of concurrent transfers: ``sends``/``recvs`` are (group rank, tensor)."""
    tensors = [t for _, t in sends] + [t for _, t in recvs]
    dev = _device_of(tensors)
    blocks = []
    for lst, name in ((sends, "input"), (recvs, "output")):
        row = []
        for peer, t in lst:
            p, n, c, _ = _buffer(t, name)
            if c != dtype_code:
                raise ValueError(f"{kind}: every tensor must have the same dtype")
            row.append((peer, p, n))
        blocks.append(row)
    work = _cuda_group(group, dev).exchange(kind, dtype_code, count, blocks[0], blocks[1],
                                            _current_stream(dev), keep)
    return _finish(work, outputs, dev, async_op)


def gather(group: Any, tensor: Any, gather_list: Optional[Sequence[Any]], dst: int,
           async_op: bool = False) -> Optional[CudaWork]:
    """Gathers every rank's ``tensor`` into ``gather_list`` (one per rank) on group rank
    ``dst``; ``gather_list`` is None on the other ranks."""
    _, n, code, _ = _buffer(tensor, "tensor")
    sends = [(dst, tensor)]
    recvs = list(enumerate(gather_list)) if group._rank == dst and gather_list else []
    outputs = list(gather_list or [])
    return _exchange(group, "gather", code, n, sends, recvs, (tensor, outputs), outputs,
                     async_op)


def scatter(group: Any, tensor: Any, scatter_list: Optional[Sequence[Any]], src: int,
            async_op: bool = False) -> Optional[CudaWork]:
    """Scatters ``scatter_list`` (one tensor per rank, on group rank ``src``) into every
    rank's ``tensor``."""
    _, n, code, _ = _buffer(tensor, "tensor")
    inputs = list(scatter_list or []) if group._rank == src else []
    sends = list(enumerate(inputs))
    return _exchange(group, "scatter", code, n, sends, [(src, tensor)], (tensor, inputs),
                     [tensor], async_op)


def reduce_scatter(group: Any, output: Any, input_list: Sequence[Any], op_code: int,
                   premul: Optional[float] = None,
                   async_op: bool = False) -> Optional[CudaWork]:
    """Reduces ``input_list[r]`` of every rank into ``output`` on rank r."""
    out, n, code, dev = _buffer(output, "output")
    ins = [_buffer(t, "input_list") for t in input_list]
    _device_of([output, *input_list])
    if any(i[1] != n or i[2] != code for i in ins):
        raise ValueError("reduce_scatter: every input must have the output's size and dtype")
    work = _cuda_group(group, dev).reduce_scatter([i[0] for i in ins], out, n, code, op_code,
                                                  _current_stream(dev),
                                                  (output, list(input_list)), premul)
    return _finish(work, [output], dev, async_op)


def reduce_scatter_tensor(group: Any, output: Any, input: Any, op_code: int,
                          premul: Optional[float] = None,
                          async_op: bool = False) -> Optional[CudaWork]:
    """Reduces ``input`` (world_size blocks of ``output``'s size) across the group and leaves
    block ``rank`` of the result in ``output``."""
    out, n, code, dev = _buffer(output, "output")
    inp, in_n, in_code, in_dev = _buffer(input, "input")
    _one_device([dev, in_dev])
    if in_code != code or in_n != n * group._size:
        raise ValueError(
            f"reduce_scatter_tensor: input must have world_size ({group._size}) times the "
            f"output's {n} elements of {output.dtype}, got {in_n} of {input.dtype}"
        )
    work = _cuda_group(group, dev).reduce_scatter_tensor(inp, out, n, code, op_code,
                                                         _current_stream(dev), (output, input),
                                                         premul)
    return _finish(work, [output], dev, async_op)


def all_to_all(group: Any, output_tensor_list: Sequence[Any], input_tensor_list: Sequence[Any],
               async_op: bool = False) -> Optional[CudaWork]:
    """Sends ``input_tensor_list[r]`` to rank r and receives rank r's block into
    ``output_tensor_list[r]`` (sizes may differ per pair)."""
    _, _, code, _ = _buffer(input_tensor_list[0], "input_tensor_list")
    outputs = list(output_tensor_list)
    return _exchange(group, "all_to_all", code, 0, list(enumerate(input_tensor_list)),
                     list(enumerate(outputs)), (outputs, list(input_tensor_list)), outputs,
                     async_op)


def _splits(t: Any, sizes: Optional[Sequence[int]], world: int, name: str) -> list[tuple[int, int]]:
    """(element offset, element count) of each rank's block of ``t`` split along dim 0."""
    rows = dim0(t)
    per_row = t.numel() // rows if rows else 0
    if not sizes:
        if rows % world:
            raise ValueError(f"{name}: dim 0 ({rows}) is not divisible by world_size ({world})")
        sizes = [rows // world] * world
    if len(sizes) != world or sum(sizes) != rows:
        raise ValueError(f"{name}: split sizes {list(sizes)} do not split dim 0 ({rows}) "
                         f"into world_size ({world}) blocks")
    out, at = [], 0
    for s in sizes:
        out.append((at * per_row, s * per_row))
        at += s
    return out


def all_to_all_single(group: Any, output: Any, input: Any,
                      output_split_sizes: Optional[Sequence[int]] = None,
                      input_split_sizes: Optional[Sequence[int]] = None,
                      async_op: bool = False) -> Optional[CudaWork]:
    """Splits ``input`` along dim 0 (``input_split_sizes``, equal when None), sends block r to
    rank r, and concatenates what every rank sends into ``output``
    (``output_split_sizes``)."""
    inp, n_in, code, dev = _buffer(input, "input")
    out, n_out, out_code, out_dev = _buffer(output, "output")
    _one_device([dev, out_dev])
    if out_code != code:
        raise ValueError("all_to_all_single: output and input must have the same dtype")
    world, size = group._size, ITEMSIZE[code]
    if (not output_split_sizes and not input_split_sizes and n_in == n_out
            and dim0(input) % world == 0 and dim0(output) % world == 0):
        # Equal blocks, laid out by the engine: no per-rank lists here.
        work = _cuda_group(group, dev).exchange("all_to_all", code, n_in // world, inp, out,
                                                _current_stream(dev), (output, input))
        return _finish(work, [output], dev, async_op)
    sends = [(r, inp + at * size, n)
             for r, (at, n) in enumerate(_splits(input, input_split_sizes, world, "input"))]
    recvs = [(r, out + at * size, n)
             for r, (at, n) in enumerate(_splits(output, output_split_sizes, world, "output"))]
    work = _cuda_group(group, dev).exchange("all_to_all", code, 0, sends, recvs,
                                            _current_stream(dev), (output, input))
    return _finish(work, [output], dev, async_op)


def isend(group: Any, tensor: Any, dst: int, tag: int = 0) -> CudaWork:
    """Sends ``tensor`` to group rank ``dst``; NCCL for tag 0, host memory otherwise."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    work = _cuda_group(group, dev).send(ptr, n, code, dst, tag, _current_stream(dev), (tensor,))
    return CudaWork(work, [tensor], dev)


def irecv(group: Any, tensor: Any, src: Optional[int] = None, tag: int = 0) -> CudaWork:
    """Receives into ``tensor`` from group rank ``src`` (any rank when None, which needs a
    nonzero tag: NCCL cannot receive from any source)."""
    ptr, n, code, dev = _buffer(tensor, "tensor")
    work = _cuda_group(group, dev).recv(ptr, n, code, src, tag, _current_stream(dev), (tensor,))
    return CudaWork(work, [tensor], dev)


def send(group: Any, tensor: Any, dst: int, tag: int = 0) -> None:
    """``isend(...).wait()``: the current stream waits for the send (as torch's NCCL)."""
    isend(group, tensor, dst, tag).wait()


def recv(group: Any, tensor: Any, src: Optional[int] = None, tag: int = 0) -> int:
    """Receives into ``tensor`` and returns the sender's group rank. The current stream waits
    for the data; a receive from any source blocks the host until the sender is known."""
    work = irecv(group, tensor, src, tag)
    work.wait()
    if src is not None:
        return src
    work._synchronize_host()
    return work.source_rank()


def batch_isend_irecv(group: Any, ops: Sequence[tuple[bool, Any, int, int]]) -> list[CudaWork]:
    """Runs ``ops`` — ``(is_send, tensor, group peer rank, tag)`` each, torch's ``P2POp`` — as
    one group of concurrent transfers; returns one Work for them all (torch returns a list)."""
    bufs = [(send_, *_buffer(t, "tensor"), peer, tag) for send_, t, peer, tag in ops]
    dev = _device_of([t for _, t, _, _ in ops])
    work = _cuda_group(group, dev).batch_isend_irecv(
        [(b[0], b[5], b[1], b[2], b[3], b[6]) for b in bufs], _current_stream(dev),
        [t for _, t, _, _ in ops],
    )
    return [CudaWork(work, [t for _, t, _, _ in ops], dev)]


def barrier(group: Any, device: int, async_op: bool = False) -> Optional[CudaWork]:
    """A barrier on ``device`` (a one-element all_reduce); blocks the host until every rank
    has reached it, as torch's NCCL barrier does (``async_op``: returns the Work instead)."""
    cuda = _cuda_group(group, device)
    work = CudaWork(cuda.barrier(_current_stream(device)), [], device)
    if async_op:
        return work
    work._synchronize_host()
    return None


__all__ = [
    "CudaWork", "abort", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "gather", "irecv",
    "is_available", "isend", "library_paths", "load_report", "nccl_unique_id", "nccl_version",
    "new_subgroup", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "send", "check_shrink", "shrink", "shutdown", "staged",
]
