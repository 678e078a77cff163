"""Debug levels (torch's ``TORCH_DISTRIBUTED_DEBUG``), the DETAIL-mode cross-rank check of
every collective's arguments, the ``"rustdist"`` logger, and ``compiled_like``, which the
API's wrappers are made with."""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
import logging
import os
from typing import Any, Callable, Optional, Sequence, TypeVar

import numpy as np

from ._errors import DistBackendError

#: Logger of rustdist: init, group creation and destruction, failed calls (all INFO, so that
#: expected errors print nothing unless logging is configured).
logger = logging.getLogger("rustdist")


class DebugLevel(enum.IntEnum):
    """An enum whose values are the debug levels of torch's ``TORCH_DISTRIBUTED_DEBUG``:
    ``OFF``, ``INFO`` (log init, group creation and destruction, failures) and ``DETAIL``
    (also check before every collective that all ranks called it with the same arguments)."""

    OFF = 0
    INFO = 1
    DETAIL = 2

    def __str__(self) -> str:
        return f"DebugLevel.{self.name}"


level: DebugLevel = DebugLevel.OFF
# Read on every collective: a plain bool keeps the usual path to one test.
detail: bool = False

_ENV_VARS = ("RUSTDIST_DEBUG", "TORCH_DISTRIBUTED_DEBUG")


def set_debug_level(new_level: Any) -> None:
    """Sets the debug level (a ``DebugLevel``, torch's ``DebugLevel`` or its name)."""
    global level, detail
    name = new_level if isinstance(new_level, str) else getattr(new_level, "name", None)
    if name is None or name.upper() not in DebugLevel.__members__:
        raise ValueError(
            f"Invalid debug level {new_level!r}: expected one of OFF, INFO or DETAIL"
        )
    level = DebugLevel[name.upper()]
    detail = level is DebugLevel.DETAIL
    if level >= DebugLevel.INFO and logger.level in (logging.NOTSET, logging.WARNING):
        logger.setLevel(logging.INFO)


def get_debug_level() -> DebugLevel:
    """Gets the debug level."""
    return level


def set_debug_level_from_env() -> None:
    """Sets the debug level from ``RUSTDIST_DEBUG`` or, when unset, ``TORCH_DISTRIBUTED_DEBUG``
    (``OFF``, ``INFO`` or ``DETAIL``; unset means ``OFF``)."""
    for var in _ENV_VARS:
        value = os.environ.get(var)
        if value:
            if value.upper() not in DebugLevel.__members__:
                raise ValueError(
                    f"The value of {var} must be OFF, INFO, or DETAIL, but it is {value!r}"
                )
            set_debug_level(value)
            return
    set_debug_level(DebugLevel.OFF)


def apply_env() -> None:
    """Sets the level from the environment when one of its variables is set; called by
    ``init_process_group`` so that a variable set after ``import rustdist`` counts."""
    if any(os.environ.get(var) for var in _ENV_VARS):
        set_debug_level_from_env()


F = TypeVar("F", bound=Callable[..., Any])


def log_failure(name: str, e: BaseException) -> None:
    """Logs (INFO, logger ``rustdist``) that the call ``name`` raised ``e``."""
    logger.info("%s failed: %s: %s", name, type(e).__name__, e)


def exception_logger(fn: F) -> F:
    """Logs (INFO, logger ``rustdist``) an exception raised by ``fn``, then re-raises it.

    The wrapper is compiled with ``fn``'s own parameters (and shares its defaults): collectives
    run in tight loops, where packing ``*args, **kwargs`` would cost more than the call."""

    def log(e: Exception) -> None:
        log_failure(fn.__name__, e)

    body = ("    try:\n"
            "        return fn({call})\n"
            "    except Exception as e:\n"
            "        log(e)\n"
            "        raise\n")
    return compiled_like(fn, body, {"fn": fn, "log": log})


def compiled_like(fn: F, body: str, namespace: dict[str, Any]) -> F:
    """A function with ``fn``'s name, parameters and defaults (``functools.update_wrapper``'d
    to ``fn``) whose body is ``body``, in which ``{call}`` stands for the arguments passed on
    as ``fn`` takes them; the names the body uses come from ``namespace``. Calls bind their
    arguments in the interpreter, keywords included, with no ``*args, **kwargs`` to pack."""
    decl: list[str] = []
    call: list[str] = []
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            decl.append(f"*{p.name}")
            call.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            decl.append(f"**{p.name}")
            call.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if i == 0 or params[i - 1].kind not in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
                decl.append("*")
            decl.append(p.name)
            call.append(f"{p.name}={p.name}")
        else:
            decl.append(p.name)
            call.append(p.name)
            if p.kind is p.POSITIONAL_ONLY and (
                    i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
                decl.append("/")
    source = f"def {fn.__name__}({', '.join(decl)}):\n" + body.format(call=", ".join(call))
    # The module's name makes the function's frames rustdist's (warnings skip them).
    namespace = {"__name__": fn.__module__, **namespace}
    exec(source, namespace)  # noqa: S102 - source built above from fn's parameter names
    wrapper = namespace[fn.__name__]
    # From the function the signature came from (a decorated fn's own are *args, **kwargs).
    inner = inspect.unwrap(fn)
    wrapper.__defaults__ = inner.__defaults__
    wrapper.__kwdefaults__ = inner.__kwdefaults__
    return functools.update_wrapper(wrapper, fn)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# DETAIL: cross-rank check of a collective's arguments

_DESC_BYTES = 256  # one fixed-size descriptor per rank
_UINT8 = 8  # _core dtype code
_DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                "uint8", "bool", "complex64", "complex128")
_OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM")


def _encode(fields: list[Any]) -> bytes:
    """A compact descriptor; the shapes are hashed when the whole does not fit."""
    raw = json.dumps(fields, separators=(",", ":")).encode()
    if len(raw) > _DESC_BYTES:
        digest = hashlib.sha1(json.dumps(fields[4]).encode()).hexdigest()[:16]
        fields = [*fields[:4], f"{len(fields[4])} shapes, hash {digest}"]
        raw = json.dumps(fields, separators=(",", ":")).encode()
    return raw.ljust(_DESC_BYTES, b"\0")


def _show(what: str, value: Any) -> str:
    if value is None:
        return "none"
    if what == "op":
        return _OP_NAMES[value]
    if what == "dtype":
        return _DTYPE_NAMES[value]
    if what == "shape" and isinstance(value, list) and len(value) == 1:
        return str(value[0])
    return str(value)


def check_collective(core_pg: Any, ranks: Sequence[int], name: str, dtype: Optional[int],
                     shapes: Optional[list[Any]], op: Optional[int] = None,
                     root: Optional[int] = None) -> None:
    """DETAIL mode: checks with one all_gather of a fixed-size descriptor that every rank of
    the group runs collective ``name`` with the same reduce ``op`` code, ``dtype`` code,
    ``shapes`` and ``root`` (None: not compared). On a mismatch every rank raises the same
    DistBackendError naming the (global) ranks and what differs; the group stays usable."""
    shape_list = None if shapes is None else [list(s) for s in shapes]
    mine = _encode([name, op, dtype, root, shape_list])
    size = core_pg.size
    inp = np.frombuffer(mine, dtype=np.uint8).copy()
    out = np.zeros(size * _DESC_BYTES, dtype=np.uint8)
    ptrs = [out.ctypes.data + r * _DESC_BYTES for r in range(size)]
    core_pg.all_gather(inp.ctypes.data, ptrs, _DESC_BYTES, _UINT8, (inp, out)).wait()
    descs = [json.loads(out[r * _DESC_BYTES:(r + 1) * _DESC_BYTES].tobytes().rstrip(b"\0"))
             for r in range(size)]
    first = descs[0]
    for r in range(1, size):
        other = descs[r]
        if other == first:
            continue
        if other[0] != first[0]:
            raise DistBackendError(
                f"collective mismatch: rank {ranks[0]} runs {first[0]} vs rank {ranks[r]} "
                f"runs {other[0]}"
            )
        for i, what in ((1, "op"), (2, "dtype"), (4, "shape"), (3, "root")):
            if other[i] != first[i]:
                raise DistBackendError(
                    f"{name} {what} mismatch: rank {ranks[0]} {_show(what, first[i])} vs "
                    f"rank {ranks[r]} {_show(what, other[i])}"
                )


__all__ = ["DebugLevel", "apply_env", "check_collective", "compiled_like", "exception_logger",
           "get_debug_level", "log_failure", "logger", "set_debug_level",
           "set_debug_level_from_env"]
