"""Exception types of rustdist, matching torch.distributed's.

When torch is importable each class also subclasses torch's class of the same name, so code
written as ``except torch.distributed.DistNetworkError`` catches rustdist's errors too.
"""

from __future__ import annotations

import enum
from typing import Any

try:  # torch is optional: rustdist works on numpy arrays without it.
    import torch.distributed as _td

    _TorchDistError: type = _td.DistError
    _TorchBackendError: type = _td.DistBackendError
    _TorchNetworkError: type = _td.DistNetworkError
    _TorchStoreError: type = _td.DistStoreError
except (ImportError, AttributeError):
    _TorchDistError = RuntimeError
    _TorchBackendError = RuntimeError
    _TorchNetworkError = RuntimeError
    _TorchStoreError = RuntimeError


class DistError(_TorchDistError):
    """Base class of distributed errors (a RuntimeError)."""


class DistBackendError(DistError, _TorchBackendError):
    """A collective failed in the backend: timeout, mismatch between ranks, aborted group."""


class DistNetworkError(DistError, _TorchNetworkError):
    """A peer died, hung up or could not be reached."""


class DistStoreError(DistError, _TorchStoreError):
    """A store operation failed or timed out."""


class _ErrorType(enum.IntEnum):
    """torch's ``ErrorType`` (same names and values), for torch before 2.14."""

    SUCCESS = 0
    TIMEOUT = 1
    COMM_ERROR = 2
    REMOTE_ERROR = 3

    def __str__(self) -> str:
        return f"ErrorType.{self.name}"  # as torch's prints


#: What failed a group (``ProcessGroup.get_error``): torch's ``ErrorType`` where torch has it.
ErrorType: Any = _ErrorType
try:
    from torch._C._distributed_c10d import ErrorType  # type: ignore[no-redef]  # noqa: F811
except ImportError:
    pass


__all__ = ["DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "ErrorType"]
