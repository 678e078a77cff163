"""rustdist's CUDA path on any machine, GPU or not: NCCL and the CUDA runtime load from torch's
nvidia wheels at run time, NCCL's version and unique ids come through, and without a device
every entry point fails with a clear reason (the GPU tests are in test_cuda_gpu.py)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest

import rustdist
import rustdist._core as core
import rustdist.cuda as rcuda
from rustdist import distributed_c10d as c10d
from rustdist._torch_backend import new_process_group

torch = pytest.importorskip("torch")


def _wheel_version(dist: str) -> tuple[int, int, int]:
    major, minor, patch = (int(p) for p in importlib.metadata.version(dist).split(".")[:3])
    return major, minor, patch


def _nccl_wheel() -> str:
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            importlib.metadata.version(dist)
            return dist
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("no nvidia-nccl wheel installed")


@pytest.mark.timeout(30)
def test_library_paths_are_the_nvidia_wheel_folders() -> None:
    _nccl_wheel()
    paths = rcuda.library_paths()
    assert any(p.endswith(os.path.join("nvidia", "nccl", "lib")) for p in paths), paths
    assert all(os.path.isdir(p) for p in paths)


@pytest.mark.timeout(30)
def test_nccl_version_is_the_wheels() -> None:
    dist = _nccl_wheel()
    assert rcuda.nccl_version() == _wheel_version(dist)
    report = rcuda.load_report()
    assert report["nccl"]["version"] == _wheel_version(dist)
    assert os.path.dirname(report["nccl"]["path"]) in rcuda.library_paths()


@pytest.mark.timeout(30)
def test_nccl_unique_ids_need_no_gpu() -> None:
    _nccl_wheel()
    a, b = rcuda.nccl_unique_id(), rcuda.nccl_unique_id()
    assert isinstance(a, bytes) and len(a) == 128 and len(b) == 128
    assert a != b


@pytest.mark.timeout(60)
def test_a_missing_nccl_names_every_file_tried() -> None:
    # A fresh process that loads only the extension: importing torch (which rustdist's package
    # does) loads the wheel's libnccl, and a loaded NCCL stays for the life of the process.
    code = (
        "import importlib.util, os\n"
        "pkg = importlib.util.find_spec('rustdist').submodule_search_locations[0]\n"
        "so = [f for f in os.listdir(pkg) if f.startswith('_core') and f.endswith('.so')][0]\n"
        "spec = importlib.util.spec_from_file_location('_core', os.path.join(pkg, so))\n"
        "c = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(c)\n"
        "try:\n"
        "    print('loaded', c.cuda_nccl_version([]))\n"
        "except RuntimeError as e:\n"
        "    print('error', e)\n"
    )
    env = dict(os.environ, RUSTDIST_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=50, check=True).stdout
    if out.startswith("loaded"):
        pytest.skip(f"the system has its own NCCL: {out.strip()}")
    assert out.startswith("error cannot load NCCL: /nonexistent/libnccl.so.2: "), out
    assert "; libnccl.so.2: " in out, out


@pytest.mark.timeout(30)
def test_load_report_says_why_there_is_no_device() -> None:
    report = rcuda.load_report()
    assert set(report) == {"nccl", "cudart", "driver_version", "device_count"}
    if torch.cuda.is_available():
        assert report["device_count"] == torch.cuda.device_count()
    elif "error" not in report["cudart"]:
        assert isinstance(report["device_count"], str)
        assert report["device_count"].startswith("cudaGetDeviceCount failed: "), report


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


def _world1(name: str) -> c10d.ProcessGroup:
    store = core.HashStore()
    pg = new_process_group(store, 0, 1, 10.0, name, [0])
    pg._store = store  # what the API layer will set on every group
    return pg


@needs_no_gpu
@pytest.mark.timeout(30)
def test_without_a_device_nothing_is_available() -> None:
    assert rcuda.is_available() is False
    assert core.cuda_is_available(rcuda.library_paths()) is False


@needs_no_gpu
@pytest.mark.timeout(30)
def test_a_cuda_group_without_a_device_raises_the_reason() -> None:
    pg = _world1("no-device")
    try:
        with pytest.raises(RuntimeError, match=r"^CUDA is not available: ") as info:
            rcuda._cuda_group(pg, 0)
        if "error" not in rcuda.load_report()["cudart"]:
            assert "cudaGetDeviceCount failed" in str(info.value)
        assert getattr(pg, "_cuda", None) is None
        # The same through _core directly.
        with pytest.raises(RuntimeError, match=r"^CUDA is not available: "):
            core.CudaGroup(pg._pg, pg._store, 0, 1, 10.0, "no-device-2", 0, rcuda.library_paths())
    finally:
        pg._pg.shutdown()


@pytest.mark.timeout(30)
def test_cpu_tensors_are_refused_by_name() -> None:
    pg = _world1("cpu-tensor")
    try:
        with pytest.raises(RuntimeError, match="`tensor` must be a CUDA tensor, it is on cpu"):
            rcuda.all_reduce(pg, torch.zeros(4), 0)
        with pytest.raises(TypeError, match="Expected parameter `tensor` of type torch.Tensor"):
            rcuda.broadcast(pg, [1, 2], 0)
    finally:
        pg._pg.shutdown()


@pytest.mark.timeout(30)
def test_cuda_work_is_a_rustdist_work() -> None:
    assert issubclass(rcuda.CudaWork, rustdist.Work)
    assert set(rcuda.__all__) <= set(dir(rcuda))


@pytest.mark.timeout(30)
def test_the_dlpack_reader_reads_nothing_but_cuda_tensors() -> None:
    import numpy as np

    for x in (torch.zeros(3), torch.zeros(3, dtype=torch.complex64), np.zeros(3), "tensor", None):
        assert core.cuda_buffer(x) is None, x
