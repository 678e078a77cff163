"""Collective hooks, as torch 2.14 added them to ``ProcessGroup``: pre-hooks and post-hooks
(``register_pre_hook(hook_id, fn)``, ``register_post_hook``) called around every collective
and point-to-point operation a group issues, in ``hook_id`` order, with torch's
``PreHookArgs`` / ``PostHookArgs`` (``name``, a ``HookOpName``; ``async_op``; the input and
output tensors; ``root``; ``op_id``, which pairs a pre-hook call with its post-hook call;
the post-hook's ``work``).

A group keeps its hooks in a :class:`Hooks` (``group._hooks``, None while none is
registered, so that the usual call pays one attribute read); ``_profiling.profiled``, which
wraps every operation's body, fires them, and the engine's fast path hands a hooked group's
calls to Python (``_core.ProcessGroup.hooked``). Without torch 2.14 (older torch, or numpy
arrays) the same fields come in this module's own ``PreHookArgs`` / ``PostHookArgs`` and
``HookOpName``.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Optional

try:  # torch 2.14+: torch's own argument types, which hooks written for gloo expect.
    from torch._C._distributed_c10d import HookOpName as _TorchHookOpName
    from torch._C._distributed_c10d import PostHookArgs as _TorchPostHookArgs
    from torch._C._distributed_c10d import PreHookArgs as _TorchPreHookArgs
    from torch import Tensor as _Tensor
except ImportError:
    _TorchHookOpName = _TorchPreHookArgs = _TorchPostHookArgs = _Tensor = None


class HookOpName(enum.IntEnum):
    """torch's ``HookOpName`` (same names and values), for torch before 2.14 and numpy."""

    SEND = 0
    RECV = 1
    BROADCAST = 2
    ALLREDUCE = 3
    REDUCE = 4
    ALLGATHER = 5
    REDUCE_SCATTER = 6
    ALLTOALL = 7
    BARRIER = 8
    SCATTER = 9
    GATHER = 10
    SPLIT = 11
    NEW_WINDOW = 12
    ALLREDUCE_COALESCED = 13
    ALLGATHER_BASE = 14
    ALLGATHER_COALESCED = 15
    ALLGATHER_INTO_TENSOR_COALESCED = 16
    REDUCE_SCATTER_BASE = 17
    REDUCE_SCATTER_TENSOR_COALESCED = 18
    ALLTOALL_BASE = 19
    UNKNOWN = 20

    def __str__(self) -> str:
        return f"HookOpName.{self.name}"  # as torch's prints


class PreHookArgs:
    """What a pre-hook is called with (torch's ``PreHookArgs``, for torch before 2.14 and
    numpy arrays)."""

    __slots__ = ("name", "async_op", "input_tensors", "output_tensors", "root", "op_id")

    def __init__(self) -> None:
        self.name: Any = HookOpName.UNKNOWN
        self.async_op = False
        self.input_tensors: list[Any] = []
        self.output_tensors: list[Any] = []
        self.root = -1
        self.op_id = 0


class PostHookArgs:
    """What a post-hook is called with (torch's ``PostHookArgs``, for torch before 2.14 and
    numpy arrays); ``work`` is None for a synchronous call."""

    __slots__ = ("name", "async_op", "work", "op_id")

    def __init__(self) -> None:
        self.name: Any = HookOpName.UNKNOWN
        self.async_op = False
        self.work: Any = None
        self.op_id = 0


#: The hook name of each operation body (``_profiling.Spec.name``; the coalesced pairs by the
#: collective they coalesce). None: fires no hook (torch's monitored_barrier is no dispatcher
#: op; a batch fires its sends and receives one by one).
_NAMES: dict[str, Optional[str]] = {
    "all_reduce": "ALLREDUCE",
    "all_reduce_coalesced": "ALLREDUCE_COALESCED",
    "reduce": "REDUCE",
    "broadcast": "BROADCAST",
    "reduce_scatter_tensor": "REDUCE_SCATTER_BASE",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_gather": "ALLGATHER",
    "all_gather_coalesced": "ALLGATHER_COALESCED",
    "all_gather_into_tensor": "ALLGATHER_BASE",
    "all_gather_into_tensor_coalesced": "ALLGATHER_INTO_TENSOR_COALESCED",
    "reduce_scatter_tensor_coalesced": "REDUCE_SCATTER_TENSOR_COALESCED",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "all_to_all": "ALLTOALL",
    "all_to_all_single": "ALLTOALL_BASE",
    "barrier": "BARRIER",
    "isend": "SEND",
    "irecv": "RECV",
    "monitored_barrier": None,
    "batch_isend_irecv": None,
}


def fires(op: str) -> bool:
    """Whether operation ``op`` (a ``Spec`` name) fires hooks."""
    return _NAMES.get(op) is not None


def _flat(x: Any) -> list[Any]:
    """The tensors of ``x`` (a tensor, None, or nested lists of them) as one list."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flat(item)]
    return [x]


class Hooks:
    """A group's pre- and post-hooks by id, and the counter that numbers the operations they
    see (``op_id``)."""

    __slots__ = ("pre", "post", "op_id")

    def __init__(self) -> None:
        self.pre: dict[int, Callable[[Any], None]] = {}
        self.post: dict[int, Callable[[Any], None]] = {}
        self.op_id = 0

    def __bool__(self) -> bool:
        return bool(self.pre or self.post)

    def before(self, op: str, async_op: bool, root: Optional[int], inputs: Any,
               outputs: Any) -> int:
        """Calls the pre-hooks for operation ``op`` (in id order); its ``op_id``."""
        op_id, self.op_id = self.op_id, self.op_id + 1
        if self.pre:
            ins, outs = _flat(inputs), _flat(outputs)
            args = _pre_args(ins + outs)
            args.name = _name(op, args)
            args.async_op = bool(async_op)
            args.input_tensors, args.output_tensors = ins, outs
            args.root = -1 if root is None else int(root)
            args.op_id = op_id
            for hook_id in sorted(self.pre):
                self.pre[hook_id](args)
        return op_id

    def after(self, op: str, async_op: bool, op_id: int, work: Any) -> None:
        """Calls the post-hooks for operation ``op`` issued with ``op_id``; ``work`` is its
        Work (None once a synchronous call is done)."""
        if not self.post:
            return
        args = _post_args(work)
        args.name = _name(op, args)
        args.async_op = bool(async_op)
        if work is not None:
            args.work = work
        args.op_id = op_id
        for hook_id in sorted(self.post):
            self.post[hook_id](args)


def _pre_args(tensors: list[Any]) -> Any:
    """torch's PreHookArgs where torch has them and every tensor is a torch tensor."""
    if _TorchPreHookArgs is not None and all(isinstance(t, _Tensor) for t in tensors):
        return _TorchPreHookArgs()
    return PreHookArgs()


def _post_args(work: Any) -> Any:
    """torch's PostHookArgs where torch has them and ``work`` is none or a torch Work."""
    if _TorchPostHookArgs is None:
        return PostHookArgs()
    args = _TorchPostHookArgs()
    if work is not None:
        try:
            args.work = work
        except TypeError:  # a rustdist Work without torch's base (CUDA's, numpy's)
            return PostHookArgs()
    return args


def _name(op: str, args: Any) -> Any:
    """``op``'s HookOpName, torch's where ``args`` is torch's."""
    name = _NAMES[op]
    if isinstance(args, (PreHookArgs, PostHookArgs)):
        return HookOpName[name]
    return getattr(_TorchHookOpName, name)


def check_hook(hook_id: Any, hook: Any) -> int:
    """The ``hook_id`` of a registration, checked as torch's binding checks it."""
    if not isinstance(hook_id, int) or isinstance(hook_id, bool):
        raise TypeError(f"hook_id must be an int, got {type(hook_id).__name__}")
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    return hook_id


__all__ = ["HookOpName", "Hooks", "PostHookArgs", "PreHookArgs", "check_hook", "fires"]
