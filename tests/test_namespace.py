"""torch.distributed's whole namespace under rustdist, and rustdist without torch.

Every public name of torch.distributed is ``rustdist.<name>``: rustdist's own where it has
one, otherwise torch's very object; ``import rustdist.<submodule>`` imports torch's.
Without torch (simulated by blocking its import in a fresh interpreter) rustdist still
imports and runs on numpy arrays, and torch-only names fail with a message that says so."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as td

import rustdist

pytestmark = pytest.mark.timeout(120)

#: rustdist's own names (defined before any lazy lookup), which shadow torch's on purpose.
OWN = set(vars(rustdist))
SUBPACKAGES = [m.name for m in pkgutil.iter_modules(td.__path__) if not m.name.startswith("_")]


def test_every_public_name_is_reachable() -> None:
    for sub in SUBPACKAGES:
        importlib.import_module(f"torch.distributed.{sub}")
    missing, different = [], []
    for name in (n for n in dir(td) if not n.startswith("_")):
        try:
            value = getattr(rustdist, name)
        except AttributeError:
            missing.append(name)
            continue
        if name not in OWN and value is not getattr(td, name):
            different.append(name)
    assert not missing, f"torch.distributed names missing from rustdist: {missing}"
    assert not different, f"names that are not torch's object: {different}"
    for name in ("device_mesh", "init_device_mesh", "DeviceMesh", "tensor", "algorithms",
                 "optim", "checkpoint", "elastic", "is_torchelastic_launched",
                 "is_gloo_available", "is_nccl_available", "is_mpi_available",
                 "get_node_local_rank", "reduce_op"):
        assert name in dir(rustdist), name


def test_submodules_import_as_torchs() -> None:
    import rustdist.checkpoint as dcp
    from rustdist.checkpoint.state_dict import get_state_dict
    from rustdist.tensor import DTensor, distribute_tensor

    import torch.distributed.checkpoint as torch_dcp
    from torch.distributed.checkpoint import state_dict as torch_sd

    assert dcp.save is torch_dcp.save and dcp.load is torch_dcp.load
    assert get_state_dict is torch_sd.get_state_dict
    assert DTensor is importlib.import_module("torch.distributed.tensor").DTensor
    assert callable(distribute_tensor)
    # rustdist's own device_mesh module: init_device_mesh inits rustdist's world first.
    assert rustdist.device_mesh.init_device_mesh is rustdist.init_device_mesh
    assert rustdist.device_mesh.DeviceMesh is td.DeviceMesh
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rustdist.no_such_module")


def test_works_without_torch() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # `import torch` now raises ImportError
        import numpy as np
        import rustdist as dist
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
        a = np.arange(6, dtype=np.float32)
        dist.all_reduce(a)
        assert a.tolist() == list(range(6)), a
        assert dist.is_initialized() and dist.get_world_size() == 1
        w = dist.all_reduce(a, async_op=True)
        assert w.get_future().wait() == [a]
        dist.destroy_process_group()
        try:
            dist.DeviceMesh
        except AttributeError as e:
            assert "torch is not installed" in str(e), e
        else:
            raise AssertionError("rustdist.DeviceMesh without torch")
        try:
            import rustdist.checkpoint
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("rustdist.checkpoint imported without torch")
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
