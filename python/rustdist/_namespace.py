"""torch.distributed's whole namespace under rustdist.

A name rustdist does not define itself resolves, on first use, to torch.distributed's object
(``rustdist.DeviceMesh``, ``rustdist.is_torchelastic_launched``, ``rustdist.checkpoint``), and
``import rustdist.<sub>`` (``import rustdist.checkpoint as dcp``,
``from rustdist.tensor import DTensor``) imports torch.distributed's submodule, seen through a
module that forwards every attribute. Nothing of torch is imported before it is asked for, so
``import rustdist`` stays as fast as before and works without torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any, Optional, Sequence

_PACKAGE = "rustdist"


def _torch_distributed() -> Optional[types.ModuleType]:
    try:
        import torch.distributed
    except ImportError:
        return None
    return torch.distributed


def resolve(name: str) -> Any:
    """torch.distributed's ``name`` (an attribute, or a submodule imported now)."""
    td = _torch_distributed()
    if td is None:
        raise AttributeError(
            f"module {_PACKAGE!r} has no attribute {name!r} (it would be torch.distributed's, "
            "and torch is not installed)"
        )
    if hasattr(td, name):
        return getattr(td, name)
    try:
        return importlib.import_module(f"torch.distributed.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"torch.distributed.{name}":
            raise
    raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r} (nor has torch.distributed)")


def names() -> list[str]:
    """torch.distributed's public names (those already imported and its subpackages)."""
    td = _torch_distributed()
    if td is None:
        return []
    import pkgutil

    subs = [m.name for m in pkgutil.iter_modules(td.__path__)]
    return sorted({n for n in [*dir(td), *subs] if not n.startswith("_")})


class _Forwarding(types.ModuleType):
    """``rustdist.<sub>`` as a module whose attributes are those of ``torch.distributed.<sub>``
    (a module of its own, so that torch's keeps its name and spec)."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self._target = target
        if hasattr(target, "__path__"):
            self.__path__: list[str] = []  # a package: its submodules are found below

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)) | set(super().__dir__()))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``rustdist.<a.b>`` that rustdist lacks as ``torch.distributed.<a.b>``."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(_PACKAGE + ".") or _torch_distributed() is None:
            return None
        torch_name = "torch.distributed." + fullname[len(_PACKAGE) + 1:]
        try:
            if importlib.util.find_spec(torch_name) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        torch_name = "torch.distributed." + spec.name[len(_PACKAGE) + 1:]
        return _Forwarding(spec.name, importlib.import_module(torch_name))

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module forwards to torch's."""


def install() -> None:
    """Adds the finder after the regular ones (rustdist's own modules come first)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


__all__ = ["install", "names", "resolve"]
