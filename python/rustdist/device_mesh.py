"""``torch.distributed.device_mesh`` on rustdist's world.

:func:`init_device_mesh` initialises rustdist's default group first when nothing has (torch's
would start a gloo world), then builds torch's ``DeviceMesh`` on it: every mesh dimension's
group is a rustdist group. Every other name is torch's (``DeviceMesh``, ...).
"""

from __future__ import annotations

from typing import Any, Optional

from . import distributed_c10d as _c10d


def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *,
                     mesh_dim_names: Optional[tuple[str, ...]] = None, **kwargs: Any) -> Any:
    """Initializes a ``DeviceMesh`` based on ``device_type``, ``mesh_shape``, and
    ``mesh_dim_names`` parameters (torch's ``init_device_mesh``), on rustdist's world: the
    default process group is initialised (env://, backend "rustdist") if it was not.

    Args:
        device_type: The device type of the mesh ("cpu").
        mesh_shape: A tuple defining the dimensions of the multi-dimensional array describing
            the layout of devices.
        mesh_dim_names: Names of the mesh dimensions, one per entry of ``mesh_shape``.
        **kwargs: Passed on to torch's ``init_device_mesh`` (e.g. ``backend_override``).

    Returns:
        A ``torch.distributed.device_mesh.DeviceMesh`` representing the device layout.
    """
    from torch.distributed import device_mesh as _torch_mesh

    if not _c10d.is_initialized():
        _c10d.init_process_group()
    return _torch_mesh.init_device_mesh(device_type, mesh_shape, mesh_dim_names=mesh_dim_names,
                                        **kwargs)


def __getattr__(name: str) -> Any:
    """torch's ``device_mesh.<name>`` (``DeviceMesh``, ...)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from torch.distributed import device_mesh as _torch_mesh
    except ImportError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (it would be "
                             "torch's, and torch is not installed)") from None
    return getattr(_torch_mesh, name)


__all__ = ["init_device_mesh"]
