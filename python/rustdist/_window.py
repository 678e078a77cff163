"""One-sided windows (torch 2.14's ``Window``: ``tensor_register``, ``put``, ``signal``,
``wait_signal``, ``map_remote_tensor``) on rustdist groups.

Where every rank shares one host with shared memory, every rank's registered bytes live in
shared memory that every rank of the host maps (UNIFIED access): ``put`` copies straight into
the target's tensor, ``map_remote_tensor`` aliases a peer's tensor without a copy, ``signal``
bumps a counter in the target's memory after the puts it follows, and ``wait_signal`` spins
briefly on it, then sleeps. Elsewhere (ranks on several hosts, or ``RUSTDIST_SHM=0``) access is
SEPARATE: a ``put`` or a ``signal`` travels on the link to the target, whose engine applies it
without its program calling anything, a signal after the puts it follows; a peer's tensor
cannot be mapped, so ``map_remote_tensor`` raises for it. A registered
torch tensor is moved into that memory (its storage is replaced, its values kept), so the
owner reads what peers put in the tensor itself; a numpy array cannot change its memory, so
its owner reads its window through ``map_remote_tensor(own rank)``. The engine's side is
``_core.Window``; torch's ``Window`` cannot be made from Python, so the torch door hands out
this class, which has its methods and signatures."""

from __future__ import annotations

import ast
import ctypes
import enum
from datetime import timedelta
from typing import Any, Optional

import numpy as np

from . import _core
from ._tensor import ITEMSIZE, buffer
from ._work import Work

try:  # torch is optional: windows work on numpy arrays without it.
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]

try:  # torch 2.14+: torch's own option and attribute classes
    from torch._C._distributed_c10d import WindowAccessType, WindowAttr
except ImportError:

    class WindowAccessType(enum.Enum):  # type: ignore[no-redef]
        """How a peer's window memory is reached (torch's ``WindowAccessType``)."""

        UNIFIED = 0
        SEPARATE = 1

    class WindowAttr:  # type: ignore[no-redef]
        """A peer window's attributes (torch's ``WindowAttr``)."""

        access_type: WindowAccessType = WindowAccessType.UNIFIED


def _seconds(opts: Any) -> Optional[float]:
    """The timeout of torch's ``*Options`` in seconds; None for its default (negative or
    zero: the group's timeout)."""
    timeout = getattr(opts, "timeout", None)
    if isinstance(timeout, timedelta) and timeout > timedelta(0):
        return timeout.total_seconds()
    return None


class Window:
    """A one-sided communication window on a group (torch's ``Window``): made collectively
    by ``_new_window``; ``tensor_register`` is collective too."""

    def __init__(self, group: Any, tensor: Any = None) -> None:
        self._group = group
        self._size: int = group._size
        self._core: Any = None
        # Every rank's registration: (element count, bytes per element, dtype code), and
        # (dtype, shape) as this rank's kind of tensor (torch or numpy) names them.
        self._targets: list[tuple[int, int, int]] = []
        self._kinds: list[tuple[Any, tuple[int, ...]]] = []
        self._tensor: Any = None
        # What a synchronous call returns: its operation is complete.
        self._done = Work(_core.join([]), [])
        if tensor is not None:
            self.tensor_register(tensor)

    def _window(self) -> Any:
        if self._core is None:
            raise RuntimeError("no tensor is registered with this window: call "
                               "tensor_register(tensor) on every rank first")
        return self._core

    def tensor_register(self, tensor: Any, owning: bool = True) -> None:
        """Registers ``tensor`` (contiguous, on CPU) as this rank's window memory; collective.
        Its values are kept; peers may ``put`` into it from then on."""
        if self._core is not None:
            raise RuntimeError("a tensor is already registered with this window; call "
                               "tensor_deregister() first")
        ptr, numel, code = buffer(tensor, "tensor", out=True)
        is_torch = torch is not None and isinstance(tensor, torch.Tensor)
        meta = repr((_dtype_name(tensor), tuple(tensor.shape), numel, code)).encode()
        core, metas = _core.Window.register(self._group._pg, ptr, tensor.nbytes, meta)
        me = self._group._rank
        self._core = core
        registered = [ast.literal_eval(m.decode()) for m in metas]
        self._targets = [(n, ITEMSIZE[c], c) for _, _, n, c in registered]
        core.set_targets([(n, c, ITEMSIZE[c]) for _, _, n, c in registered])
        self._kinds = [(getattr(torch, name) if is_torch else np.dtype(name), tuple(shape))
                       for name, shape, _, _ in registered]
        if is_torch:
            # The tensor itself now lives in the window's shared memory.
            with torch.no_grad():
                tensor.set_(self._alias(me).untyped_storage(), 0, tensor.shape, tensor.stride())
        self._tensor = tensor if owning else None

    def tensor_deregister(self) -> None:
        """Ends the registration on every rank (collective); the window takes no puts after.
        A torch tensor registered keeps its storage (and the values last put in it)."""
        self._window().deregister()
        self._core, self._tensor, self._targets, self._kinds = None, None, [], []

    def _alias(self, rank: int) -> Any:
        """Rank ``rank``'s registered tensor, mapped here (no copy)."""
        core = self._window()
        dtype, shape = self._kinds[rank]
        nbytes = core.nbytes(rank)
        if nbytes == 0:
            return (torch.empty(shape, dtype=dtype) if not isinstance(dtype, np.dtype)
                    else np.empty(shape, dtype=dtype))
        mapped = type("_Mapped", (ctypes.c_ubyte * nbytes,), {}).from_address(core.address(rank))
        mapped.window = core  # the mapping lives as long as any tensor over it
        if isinstance(dtype, np.dtype):
            return np.frombuffer(mapped, dtype=dtype).reshape(shape)
        return torch.frombuffer(mapped, dtype=dtype).view(shape)

    def _peer(self, rank: int, what: str) -> int:
        if not 0 <= rank < self._size:
            raise ValueError(f"{what} {rank} is out of range for a group of size {self._size}")
        return rank

    def put(self, tensor: Any, dst_rank: int, target_offset_nelems: int, async_op: bool,
            opts: Any = None) -> Work:
        """Writes ``tensor`` into rank ``dst_rank``'s window from element
        ``target_offset_nelems`` on; visible there once a later ``signal`` is waited for."""
        core = self._core
        if not async_op and core is not None and core.put_now(tensor, dst_rank,
                                                               target_offset_nelems):
            return self._done
        core = self._window()
        ptr, numel, code = buffer(tensor, "tensor")
        target_numel, itemsize, target_code = self._targets[self._peer(dst_rank,
                                                                        "put destination rank")]
        if code != target_code:
            raise TypeError(f"put of a {tensor.dtype} tensor into rank {dst_rank}'s window of "
                            f"{self._kinds[dst_rank][0]}: the dtypes must match")
        if target_offset_nelems < 0 or target_offset_nelems + numel > target_numel:
            raise ValueError(
                f"put of {numel} elements at offset {target_offset_nelems} does not fit rank "
                f"{dst_rank}'s window of {target_numel} elements")
        work = core.put(ptr, numel, code, dst_rank, target_offset_nelems * itemsize, tensor,
                        sync=not async_op)
        return self._done if work is None else Work(work, [tensor])

    def signal(self, peer_rank: int, async_op: bool, opts: Any = None) -> Work:
        """Signals rank ``peer_rank``, after every ``put`` this rank issued before."""
        work = self._window().signal(self._peer(peer_rank, "signal destination rank"),
                                     sync=not async_op)
        return self._done if work is None else Work(work, [])

    def wait_signal(self, peer_rank: int, async_op: bool, opts: Any = None) -> Work:
        """Waits for the next signal from rank ``peer_rank`` (within ``opts.timeout``, else
        the group's); the puts it followed are then visible here."""
        work = self._window().wait_signal(self._peer(peer_rank, "wait_signal source rank"),
                                          _seconds(opts), sync=not async_op)
        return self._done if work is None else Work(work, [])

    def map_remote_tensor(self, rank: int) -> Any:
        """Rank ``rank``'s registered tensor, aliased here without a copy (UNIFIED access);
        RuntimeError for a peer's window with SEPARATE access (on another host), which only
        ``put`` reaches."""
        return self._alias(self._peer(rank, "rank"))

    def get_attr(self, peer_rank: int) -> Any:
        """Rank ``peer_rank``'s window attributes: access type UNIFIED where its memory is
        mapped here (shared memory), SEPARATE where puts reach it over the network."""
        self._peer(peer_rank, "peer rank")
        attr = WindowAttr()
        unified = self._window().unified or peer_rank == self._group._rank
        attr.access_type = WindowAccessType.UNIFIED if unified else WindowAccessType.SEPARATE
        return attr


def _dtype_name(x: Any) -> str:
    """The name of a tensor's, an array's or a dtype's element type ("float32")."""
    return str(getattr(x, "dtype", x)).removeprefix("torch.")


__all__ = ["Window", "WindowAccessType", "WindowAttr"]
