"""rustdist's operations in ``torch.profiler`` (and ``torch.autograd.profiler``), as torch's own
backends show theirs.

Each operation, through either front door, is an event ``rustdist:<op>`` (``rustdist:all_reduce``)
that spans it: a synchronous call until it returns, an asynchronous one (``async_op=True``,
``isend``/``irecv``) until its Work completes, as gloo's work events do. Inside it, an event
``rustdist:record_param_comms`` spans the call's issue and carries the communication
metadata torch's ``record_param_comms`` carries (collective name, input and output element
counts and split sizes, dtype, group name, description and ranks, sequence number, rank), as
keyword inputs: the profiler keeps them when it records shapes (``record_shapes=True``), and
``export_chrome_trace`` writes them as the event's args. (Naming the event
``record_param_comms`` itself crashes torch 2.13's profiler, which then looks for metadata
that only torch's C++ backends can attach.)

Only the outermost operation of a call is recorded (a coalesced call runs others inside).
The same wrapper fires the group's collective hooks (``_hooks``), around the outermost
operation too (a batch of sends and receives fires each). With no profiler active and no hook
registered an operation pays two reads.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Optional, TypeVar

from . import _hooks

try:  # torch is optional: without it there is no profiler to feed.
    import torch
    from torch.autograd import profiler as _autograd_profiler
except ImportError:
    torch = None  # type: ignore[assignment]
    _autograd_profiler = None  # type: ignore[assignment]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Whether this thread is inside a recorded operation (``on``: only the outermost is
#: recorded) and inside one that fired hooks (``hooked``).
_inside = threading.local()


def _numel(x: Any) -> int:
    """Elements of a tensor or array, or of a list of them (nested lists summed)."""
    if x is None:
        return 0
    if isinstance(x, (list, tuple)):
        return sum(_numel(t) for t in x)
    return x.numel() if callable(getattr(x, "numel", None)) else int(getattr(x, "size", 0))


def _first(x: Any) -> Any:
    """The first tensor of ``x`` (a tensor, or lists of them), or None."""
    while isinstance(x, (list, tuple)):
        if not x:
            return None
        x = x[0]
    return x


#: torch dtype -> its C++ name, as ``record_param_comms`` writes it ("Float", "BFloat16").
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(t: Any) -> str:
    """The dtype of tensor ``t`` as torch's C++ names it (a numpy array's as numpy does)."""
    if t is None:
        return "Byte"
    dtype = getattr(t, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        return str(dtype)
    if dtype not in _DTYPE_NAMES:
        # "torch.FloatTensor" -> "Float"
        kind = torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1]
        _DTYPE_NAMES[dtype] = kind.removesuffix("Tensor")
    return _DTYPE_NAMES[dtype]


def _splits(x: Any) -> list[int]:
    """Per-tensor element counts of a list of tensors (a tensor alone: none)."""
    return [_numel(t) for t in x] if isinstance(x, (list, tuple)) else []


class Spec:
    """What an operation's arguments mean to the metadata and the hooks: its collective name
    and the names of its input and output arguments (and of explicit split sizes, and of its
    root or peer rank)."""

    def __init__(self, name: str, inputs: Optional[str], outputs: Optional[str],
                 in_splits: Optional[str] = None, out_splits: Optional[str] = None,
                 root: Optional[str] = None) -> None:
        self.name = name
        self.inputs, self.outputs = inputs, outputs
        self.in_splits, self.out_splits = in_splits, out_splits
        self.root = root


#: Operations that take no collective sequence number.
_P2P = {"isend", "irecv", "batch_isend_irecv"}


def _metadata(spec: Spec, pg: Any, call: inspect.BoundArguments) -> dict[str, Any]:
    """torch's ``record_param_comms`` fields for a call of ``spec`` on group ``pg``."""
    a = call.arguments
    name = spec.name if "name" not in a else f"{a['name']}_coalesced"
    ins = a.get(spec.inputs) if spec.inputs else None
    outs = a.get(spec.outputs) if spec.outputs else None
    if spec.name == "batch_isend_irecv":
        ins = [t for is_send, t, _, _ in a["ops"] if is_send]
        outs = [t for is_send, t, _, _ in a["ops"] if not is_send]
    in_splits = list(a.get(spec.in_splits) or []) if spec.in_splits else _splits(ins)
    out_splits = list(a.get(spec.out_splits) or []) if spec.out_splits else _splits(outs)
    ranks = list(pg._ranks)
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    group_name, desc = pg._trace
    return {
        "Collective name": name,
        "dtype": _dtype_name(_first(outs) if _first(ins) is None else _first(ins)),
        "In msg nelems": _numel(ins),
        "Out msg nelems": _numel(outs),
        "In split size": str(in_splits),
        "Out split size": str(out_splits),
        "Global rank start": ranks[0] if ranks else 0,
        "Global rank stride": steps.pop() if len(steps) == 1 else (1 if len(ranks) < 2 else -1),
        "Group size": pg._size,
        "Process Group Name": group_name,
        "Process Group Description": desc,
        "Process Group Ranks": str(ranks),
        "Rank": ranks[pg._rank] if ranks else pg._rank,
        "Seq": pg._pg.sequence_number + (0 if spec.name in _P2P else 1),
    }



class Span:
    """An operation's event, ended once: by whoever first sees the operation complete (its
    Work's ``wait`` or ``is_completed``, so that the event has ended before the caller goes
    on, as gloo ends its work events before the work reads complete; else the engine's
    completion callback)."""

    __slots__ = ("_handle", "_lock")

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._lock = threading.Lock()

    def end(self) -> None:
        """Ends the event (once; later calls do nothing)."""
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            torch.ops.profiler._record_function_exit._RecordFunction(handle)


def _end_on_completion(span: Span, result: Any) -> None:
    """Ends ``span`` now for a finished call (None) or several Works (a batch: its event spans
    the issue), else once the Work completes."""
    engine_work = getattr(result, "_work", None)
    if engine_work is None or not hasattr(engine_work, "add_done_callback"):
        span.end()
        return
    result._span = span
    engine_work.add_done_callback(lambda _error: span.end())


def _recorded(spec: Spec, call: inspect.BoundArguments, fn: Callable[..., Any],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    meta = _metadata(spec, call.arguments["pg"], call)
    span = Span(torch.ops.profiler._record_function_enter_new(
        f"rustdist:{meta['Collective name']}", None))
    _inside.on = True
    try:
        with torch._C._profiler._RecordFunctionFast("rustdist:record_param_comms", [], meta):
            result = fn(*args, **kwargs)
    except BaseException:
        span.end()
        raise
    finally:
        _inside.on = False
    _end_on_completion(span, result)
    return result


def _hooked(spec: Spec, call: inspect.BoundArguments, hooks: _hooks.Hooks,
            run: Callable[[], Any]) -> Any:
    """``run()`` (the operation, recorded or not) between the group's pre- and post-hooks."""
    a = call.arguments
    op = spec.name if "name" not in a else f"{a['name']}_coalesced"
    async_op = a.get("async_op", op in ("isend", "irecv"))
    # An in-place operation's tensors are its inputs alone, as torch's hooks see them.
    in_place = spec.outputs == spec.inputs
    op_id = hooks.before(op, async_op, a.get(spec.root) if spec.root else None,
                         a.get(spec.inputs) if spec.inputs else None,
                         a.get(spec.outputs) if spec.outputs and not in_place else None)
    _inside.hooked = True
    try:
        result = run()
    finally:
        _inside.hooked = False
    hooks.after(op, async_op, op_id, result)
    return result


def _profiler_on() -> bool:
    return _autograd_profiler is not None and _autograd_profiler._is_profiler_enabled


def profiled(spec: Spec) -> Callable[[_F], _F]:
    """Records the operation ``fn`` (whose first or second argument is the group ``pg``) in
    the active profiler and fires the group's hooks around it, as the module says; passes
    straight through when neither is there."""

    def wrap(fn: _F) -> _F:
        signature = inspect.signature(fn)
        at = list(signature.parameters).index("pg")
        fires = _hooks.fires(spec.name) or spec.name == "coalesced"

        @functools.wraps(fn)
        def op(*args: Any, **kwargs: Any) -> Any:
            hooks = (args[at] if len(args) > at else kwargs["pg"])._hooks
            record = _profiler_on() and not getattr(_inside, "on", False)
            if hooks is None and not record:
                return fn(*args, **kwargs)
            call = signature.bind(*args, **kwargs)
            if record:
                def run() -> Any:
                    return _recorded(spec, call, fn, args, kwargs)
            else:
                def run() -> Any:
                    return fn(*args, **kwargs)
            if hooks is None or not fires or getattr(_inside, "hooked", False):
                return run()
            return _hooked(spec, call, hooks, run)

        return op  # type: ignore[return-value]

    return wrap


__all__ = ["Span", "Spec", "profiled"]
