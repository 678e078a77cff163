"""``not_traced``: keeps torch's compiler (dynamo) out of the methods torch's C++ calls."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable, Optional, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def not_traced(fn: _F) -> _F:
    """``torch.compiler.disable`` applied lazily: C++ calls these methods from compiled code,
    and dynamo must not trace them. Until ``torch._dynamo`` is imported nothing can be
    compiling, so importing rustdist does not pay dynamo's import time."""
    disabled: Optional[Callable[..., Any]] = None

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return fn(*args, **kwargs)
            # import_module waits for another thread still importing dynamo, where reading
            # its attributes would find a half-initialised package.
            importlib.import_module("torch._dynamo").eval_frame.skip_code(method.__code__)
            disabled = sys.modules["torch"].compiler.disable(fn, recursive=True)
        return disabled(*args, **kwargs)

    return method  # type: ignore[return-value]


__all__ = ["not_traced"]
