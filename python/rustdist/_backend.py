"""Backend and device names, as torch parses them: which ones rustdist runs (every CPU
backend name on its own engine, NCCL's for CUDA tensors)."""

from __future__ import annotations

from typing import Any, Optional


class Backend(str):
    """An enum-like class for backends (torch.distributed's ``Backend``).

    ``Backend(name)`` returns the lowercase name as a ``str`` (``Backend("GLOO") == "gloo"``);
    the known names are attributes, e.g. ``Backend.GLOO``. rustdist runs every CPU backend
    name it accepts (``rustdist``, ``gloo``, ``cpu:gloo``, ``cpu:rustdist``) on its own engine.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    FAKE = "fake"
    RUSTDIST = "rustdist"

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        """Return the parsed lowercase backend name."""
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        return name.lower() if value == Backend.UNDEFINED else value


# Backends whose names init_process_group and new_group accept, alone or per device
# ("cpu:gloo,cuda:nccl"): every one runs on rustdist's engine (NCCL for CUDA tensors).
_BACKEND_NAMES = ("rustdist", "gloo", "nccl")
_DEVICES = ("cpu", "cuda")


def backend_name(backend: Optional[str], default: str, what: str) -> str:
    """``backend`` parsed as torch parses it (``None``: ``default``); raises ValueError for a
    backend or device rustdist does not run."""
    if not backend:
        return default
    name = Backend(backend)
    for part in name.split(","):
        device, _, be = part.rpartition(":")
        if be not in _BACKEND_NAMES or device not in ("", *_DEVICES):
            raise ValueError(
                f"Unsupported backend {backend!r} for {what}: rustdist runs "
                f"{', '.join(map(repr, _BACKEND_NAMES))} (all on its own engine), alone or per "
                f"device as in 'cpu:gloo,cuda:nccl' (devices {', '.join(_DEVICES)})"
            )
    return name


def check_device_id(device_id: Any) -> None:
    kind = getattr(device_id, "type", device_id)
    if device_id is not None and kind not in _DEVICES:
        raise ValueError(f"device_id {device_id} is not supported: rustdist runs on "
                         f"{' and '.join(_DEVICES)} devices")


__all__ = ["Backend", "backend_name", "check_device_id"]
