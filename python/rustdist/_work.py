"""``Work``: the handle of an operation, one class for both front doors.

rustdist's own API returns it from asynchronous calls, and the torch front door hands the same
object to torch (with torch importable it is a ``torch.distributed.Work`` subclass, whose
``wait`` and ``get_future`` torch's C++ calls). Without torch, ``get_future`` returns a minimal
future (:class:`_Future`).

No ``from __future__ import annotations`` here: TorchScript (the typed future below) cannot
resolve string annotations.
"""

import threading
import warnings
from datetime import timedelta
from typing import Any, Callable, List, Optional, Union

from ._tracing import not_traced

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch
    from torch import Tensor

    from ._torch_private import WorkBase as _WorkBase
except ImportError:
    torch = None  # type: ignore[assignment]
    _WorkBase = object  # type: ignore[assignment, misc]


def seconds(timeout: Union[timedelta, float]) -> float:
    """``timeout`` in seconds (a ``timedelta`` or a number of seconds)."""
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


class _Future:
    """A minimal ``torch.futures.Future`` for when torch is not installed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._done = False
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: list = []

    def done(self) -> bool:
        """Whether the future has a value or an error."""
        return self._done

    def wait(self) -> Any:
        """Blocks until done; returns the value or raises the error."""
        with self._cond:
            self._cond.wait_for(lambda: self._done)
        if self._error is not None:
            raise self._error
        return self._value

    value = wait

    def _complete(self, value: Any, error: Optional[BaseException]) -> None:
        with self._cond:
            self._value, self._error, self._done = value, error, True
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for cb in callbacks:
            cb(self)

    def set_result(self, value: Any) -> None:
        """Completes the future with ``value``."""
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        """Completes the future with ``error``."""
        self._complete(None, error)

    def add_done_callback(self, fn: Callable[["_Future"], None]) -> None:
        """Calls ``fn(self)`` once done (at once if done already)."""
        with self._cond:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def then(self, callback: Callable[["_Future"], Any]) -> "_Future":
        """A future of ``callback(self)``, run once this one is done."""
        nxt = _Future()

        def run(f: _Future) -> None:
            try:
                nxt.set_result(callback(f))
            except BaseException as e:  # noqa: BLE001 - handed to the chained future
                nxt.set_exception(e)

        self.add_done_callback(run)
        return nxt


if torch is not None:

    @torch.jit.ignore
    def _outputs_or_raise(fut: torch.futures.Future[List[Tensor]],
                          outputs: List[Tensor]) -> List[Tensor]:
        """``outputs``, or the operation's error. ``fut`` is the Python future the engine
        completed: once it has passed through TorchScript, an error set on it reads back as
        its value, so it is raised from here."""
        value = fut.value()
        if isinstance(value, BaseException):
            raise value
        return outputs

    def _await_outputs(fut: torch.futures.Future[List[Tensor]],
                       outputs: List[Tensor]) -> List[Tensor]:
        torch.jit.wait(fut)
        return _outputs_or_raise(fut, outputs)

    def _fork_typed(fut: torch.futures.Future[List[Tensor]],
                    outputs: List[Tensor]) -> torch.futures.Future[List[Tensor]]:
        # A future made in Python holds a Python object, but DDP's C++ comm hooks
        # (fp16/bf16 compress) assert `result.isTensorList()`. A TorchScript fork returns a
        # future typed List[Tensor]; its task suspends in wait() (no thread held) and the
        # ignored Python call hands over the value, or the error, on completion.
        return torch.jit.fork(_await_outputs, fut, outputs)


_typed_fork: Any = None
_typed_fork_lock = threading.Lock()


def _typed_future(fut: Any, outputs: list) -> Any:
    """``fut`` as a future typed ``List[Tensor]`` for torch's C++, or ``fut`` itself where
    TorchScript cannot compile (Python 3.14+, a torch without it).

    Compiled once, at the first use, with torch's deprecation warning of ``torch.jit.script``
    silenced: it is about users writing TorchScript, while typed futures have no other maker
    in torch yet; a library should not make every rank of a user's job warn about it."""
    global _typed_fork
    if _typed_fork is None:  # the lock only until it is compiled: DDP asks for every bucket
        _compile_typed_fork()
    return _typed_fork(fut, outputs) if _typed_fork else fut


def _compile_typed_fork() -> None:
    global _typed_fork
    with _typed_fork_lock:
        if _typed_fork is None:
            with warnings.catch_warnings():
                # A DeprecationWarning up to torch 2.13, a FutureWarning from 2.14.
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.script")
                try:
                    _typed_fork = torch.jit.script(_fork_typed)
                except Exception:  # noqa: BLE001 - any compile failure: Python futures
                    _typed_fork = False


class Work(_WorkBase):  # type: ignore[misc, valid-type]
    """A distributed request object (torch.distributed's ``Work``), returned by collectives
    run with ``async_op=True`` and by ``isend``/``irecv``."""

    __slots__ = ("_work", "_outputs", "_timeout", "_future", "_for_torch", "_span")

    def __init__(self, work: Any, outputs: list, timeout: Optional[timedelta] = None) -> None:
        super().__init__()
        self._work = work  # the engine's Work
        self._outputs = outputs
        self._timeout = timeout  # barrier(timeout=...): the default of wait()
        self._future: Any = None
        # Set by the torch front door: get_future() is then typed for torch's C++.
        self._for_torch = False
        # The profiler's event of the operation, ended once it is seen complete (_profiling).
        self._span: Any = None

    @not_traced
    def wait(self, timeout: Optional[Union[timedelta, float]] = None) -> bool:
        """Blocks until the operation completes and returns True; raises its error, or
        ``DistBackendError`` once ``timeout`` passes. None or zero (torch's default,
        ``timedelta(0)``) means the group's timeout."""
        if not timeout:
            timeout = self._timeout
        try:
            self._work.wait(None if timeout is None else seconds(timeout))
        finally:
            if self._span is not None and self._work.is_completed():
                self._span.end()
        return True

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not); non-blocking."""
        done = self._work.is_completed()
        if done and self._span is not None:
            self._span.end()
        return done

    def is_success(self) -> bool:
        """Whether the operation has finished successfully."""
        return self._work.is_success()

    def exception(self) -> Optional[BaseException]:
        """The operation's error, or None."""
        return self._work.exception()

    def result(self) -> list:
        """The output tensors of the operation (valid once it has completed)."""
        return list(self._outputs)

    def source_rank(self) -> int:
        """The sender's group rank, for a completed receive."""
        return self._work.source_rank()

    _source_rank = source_rank

    @not_traced
    def get_future(self) -> Any:
        """A ``torch.futures.Future`` (a minimal future without torch) completed with the list
        of output tensors when the operation completes, or with its error. The torch front
        door's is typed ``List[Tensor]``, so that C++ consumers (DDP's built-in comm hooks)
        can read it."""
        if self._future is None:
            fut: Any = torch.futures.Future() if torch is not None else _Future()
            outputs = self._outputs

            def done(error: Optional[BaseException]) -> None:
                if error is None:
                    fut.set_result(outputs)
                else:
                    fut.set_exception(error)

            self._work.add_done_callback(done)
            self._future = _typed_future(fut, outputs) if self._for_torch else fut
        return self._future


__all__ = ["Work", "seconds"]
