"""Importing rustdist with torch hidden, for ``python -m rustdist.status``: the query answers
in milliseconds, but importing torch takes seconds (1.7 s on the 2-core VM), and the command
needs torch only to read a torch store, which it then imports on demand. The ranks of the
scale bench, which run without torch, hide it with this module too (loaded as a file,
``bench.scale_rank.hide_torch``). It imports only the standard library."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any


class _HideTorch(importlib.abc.MetaPathFinder):
    """Makes ``import torch`` fail, as where torch is not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        """Refuses torch and its submodules; leaves every other module to the next finder."""
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


_FINDER = _HideTorch()


def status_command() -> bool:
    """Whether this process is ``python -m rustdist.status`` and has not imported torch."""
    argv = sys.orig_argv
    at = argv.index("-m") + 1 if "-m" in argv else len(argv)
    return argv[at:at + 1] == ["rustdist.status"] and "torch" not in sys.modules


def hide() -> None:
    """Hides torch from the imports that follow."""
    sys.meta_path.insert(0, _FINDER)


def show() -> None:
    """Lets torch be imported again."""
    sys.meta_path.remove(_FINDER)
