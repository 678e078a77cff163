"""The sides a benchmark compares, each as buffers and one blocking call per collective:
torch tensors through the ``torch.distributed`` API (rustdist's module, or torch's on a gloo
or NCCL group), numpy buffers through mpi4py, and (``deepspeed_shm.py``) DeepSpeed's
shared-memory all_reduce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .common import Layout, expected, input_values

Call = Callable[[], Any]


def _same(buf: Any) -> Any:
    return buf


@dataclass(frozen=True)
class Side:
    """One implementation under test."""

    name: str
    #: A buffer of n elements of `dtype`.
    alloc: Callable[[int], Any]
    #: (op, input, output) -> one blocking call of op.
    make_call: Callable[[str, Any, Any], Call]
    #: This side's view of a buffer another side allocated (a torch tensor on the host).
    view: Callable[[Any], Any] = _same
    #: The element type of its buffers (a key of ``common.DTYPE_BYTES``).
    dtype: str = "float32"


def torch_alloc(dtype: str = "float32", device: str = "cpu") -> Callable[[int], Any]:
    """Allocates torch tensors of n elements of `dtype` (torch's name) on `device`."""
    import torch

    kind = getattr(torch, dtype)
    return lambda n: torch.empty(n, dtype=kind, device=device)


def _either(dist: Any, name: str, old: str) -> Callable[..., Any]:
    """`dist.name`, or `dist.old` where `name` does not exist: torch 2.13 deprecates
    ``all_gather_into_tensor``/``reduce_scatter_tensor`` (a warning per call) for the
    ``*_single`` names older torch lacks."""
    return getattr(dist, name, None) or getattr(dist, old)


def torch_side(name: str, dist: Any, group: Optional[Any] = None, device: str = "cpu",
               dtype: str = "float32") -> Side:
    """`dist` (``rustdist`` or ``torch.distributed``) on `group` (None: the default group),
    with torch tensors of `dtype` on `device`."""
    all_gather = _either(dist, "all_gather_single", "all_gather_into_tensor")
    reduce_scatter = _either(dist, "reduce_scatter_single", "reduce_scatter_tensor")

    def make_call(op: str, inp: Any, out: Any) -> Call:
        if op == "all_reduce":
            return lambda: dist.all_reduce(inp, group=group)
        if op == "broadcast":
            return lambda: dist.broadcast(inp, src=0, group=group)
        if op == "all_gather":
            return lambda: all_gather(out, inp, group=group)
        if op == "reduce_scatter":
            return lambda: reduce_scatter(out, inp, group=group)
        return lambda: dist.all_to_all_single(out, inp, group=group)

    return Side(name, torch_alloc(dtype, device), make_call, dtype=dtype)


def mpi_side(comm: Any, mpi: Any) -> Side:
    """mpi4py's buffer methods on `comm` (module `mpi`, for IN_PLACE) on numpy views of torch
    tensors (numpy's own allocations of 4 MiB and more ask for transparent huge pages, which
    torch's do not, and copies into them ran up to 1.15x faster); the all_reduce is in place,
    as torch's is."""

    def make_call(op: str, inp: Any, out: Any) -> Call:
        if op == "all_reduce":
            return lambda: comm.Allreduce(mpi.IN_PLACE, inp)
        if op == "broadcast":
            return lambda: comm.Bcast(inp, root=0)
        if op == "all_gather":
            return lambda: comm.Allgather(inp, out)
        if op == "reduce_scatter":
            return lambda: comm.Reduce_scatter_block(inp, out)
        return lambda: comm.Alltoall(inp, out)

    tensor = torch_alloc()
    return Side("mpi", lambda n: tensor(n).numpy(), make_call, view=lambda t: t.numpy())


def load(buf: Any, values: np.ndarray) -> None:
    """Copies `values` into `buf` (a numpy array or a torch tensor on any device)."""
    if isinstance(buf, np.ndarray):
        buf[:] = values
    else:
        import torch

        buf.copy_(torch.from_numpy(values))


def read(buf: Any) -> np.ndarray:
    """`buf`'s values on the host (float32 where the tensor is bfloat16 or float16, which the
    check's small integers survive exactly)."""
    return buf if isinstance(buf, np.ndarray) else buf.cpu().float().numpy()


def check(call: Call, lay: Layout, rank: int, inp: Any, out: Any) -> bool:
    """Runs `call` once on rank-dependent input; True when this rank's result is right. The
    output starts as NaN (the sides share buffers: another side's result must not pass for
    this one's); the input is zeroed afterwards: repeated all_reduce sums of zeros stay
    finite and free of denormals."""
    load(out, np.full(lay.n_out, np.nan, dtype=np.float32))
    load(inp, input_values(lay, rank))
    call()
    where, want = expected(lay, rank)
    ok = bool(np.array_equal(read(inp if where == "in" else out), want))
    load(inp, np.zeros(lay.n_in, dtype=np.float32))
    return ok
