"""Catches warnings whose origin is rustdist, in every process the tests start.

A warning counts when rustdist's code is on the stack where it is issued (torch warning about
something rustdist calls, as torch.jit.script's deprecation did), except the warnings rustdist
gives on purpose about the caller's own arguments, as torch does (:data:`DELIBERATE`). Loaded
by ``warn_site/sitecustomize.py`` (conftest puts that folder on PYTHONPATH, so rank
processes, torchrun and its workers all load it before anything else): a process that saw
such a warning says so on stderr and exits with :data:`EXIT_CODE`, and the harness's ranks
fail the case during which it came.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import warnings
from typing import Any, Optional, TextIO

#: rustdist's own warnings, torch.distributed's words about the caller's arguments.
DELIBERATE = (
    "Running ",  # a call on a group this rank is not a member of
    "Please specify timeout arg as a timedelta",  # monitored_barrier(timeout=float)
    "debug level left at OFF",  # a bad TORCH_DISTRIBUTED_DEBUG
)
EXIT_CODE = 86

_found: list[str] = []
_package_dir: Optional[str] = None


def _rustdist_dir() -> Optional[str]:
    """Where the rustdist package that would be imported lives (found, not imported)."""
    global _package_dir
    if _package_dir is None:
        spec = importlib.util.find_spec("rustdist")
        if spec is None or spec.origin is None:
            return None
        _package_dir = os.path.dirname(spec.origin) + os.sep
    return _package_dir


def _rustdist_on_stack() -> bool:
    where = _rustdist_dir()
    frame = sys._getframe(2)
    while where is not None and frame is not None:
        if frame.f_code.co_filename.startswith(where):
            return True
        frame = frame.f_back
    return False


_show_original = warnings.showwarning


def _show(message: Any, category: type, filename: str, lineno: int,
          file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
    text = str(message)
    if not text.startswith(DELIBERATE) and _rustdist_on_stack():
        found = f"{category.__name__}: {text} (issued at {filename}:{lineno})"
        _found.append(found)
        sys.stderr.write(f"warning whose origin is rustdist: {found}\n")
    _show_original(message, category, filename, lineno, file, line)


def take() -> list[str]:
    """The warnings found since the last call."""
    found = list(_found)
    _found.clear()
    return found


def _exit_if_found() -> None:
    if _found:
        sys.stderr.write(f"{len(_found)} warning(s) whose origin is rustdist (see above)\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)


def install() -> None:
    """Shows every warning once per place (DeprecationWarning too) and watches each."""
    warnings.simplefilter("default")
    warnings.showwarning = _show
    atexit.register(_exit_if_found)
