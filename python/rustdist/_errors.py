"""Exception types of rustdist, matching torch.distributed's.

When torch is importable each class also subclasses torch's class of the same name, so code
written as ``except torch.distributed.DistNetworkError`` catches rustdist's errors too.
"""

from __future__ import annotations

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


__all__ = ["DistError", "DistBackendError", "DistNetworkError", "DistStoreError"]
