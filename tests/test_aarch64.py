"""The aarch64 wheel, smoke-tested under emulation: a world of 2 aarch64 Python processes
(qemu-user) runs all_reduce, all_gather, broadcast and send/recv on numpy arrays, once over
shared memory and once over TCP (``RUSTDIST_SHM=0``), each result checked element by element
against a reference (tests/aarch64_prog.py, which runs in each rank).

What it needs, all made by ``./dev test`` (its last steps, see ``aarch64_smoke`` in dev):
- ``RUSTDIST_AARCH64_ROOT``: a root with Debian's arm64 Python 3.11 in ``usr/bin`` and numpy in
  ``site/`` (``tools/aarch64_sysroot.py`` builds it in target/aarch64-root);
- ``RUSTDIST_AARCH64_WHEEL``: the wheel (default: the one in target/wheels-aarch64);
- ``qemu-aarch64-static`` on PATH (Debian's qemu-user-static), or ``RUSTDIST_QEMU_AARCH64``.

Without ``RUSTDIST_AARCH64_ROOT`` the test skips, as it does in the main pytest pass;
without qemu, a root or a wheel it skips saying which, unless ``RUSTDIST_AARCH64_REQUIRED=1``
(what ./dev sets where it can install them: root with apt), where it fails. By hand, after
``./dev test`` (or its aarch64 steps) has made them::

    RUSTDIST_AARCH64_ROOT=target/aarch64-root .venv/bin/python -m pytest tests/test_aarch64.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from harness import free_port, reaped

#: Two emulated ranks take 10-30 s a run here (each imports numpy and rustdist in a second or
#: two, then checks 63 results).
pytestmark = pytest.mark.timeout(300)
#: The driver's wait for both ranks (a hung collective fails its rank after the 60 s group
#: timeout of aarch64_prog.py first).
RUN_TIMEOUT_S = 240.0
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
RANK_PROGRAM = TESTS / "aarch64_prog.py"
#: What every rank reports (aarch64_prog.run): 3 sizes x (6 sums, 1 max, 3 dtypes x (2
#: gathers, 2 broadcasts), 2 send/recv).
EXPECTED_CHECKS = 3 * (6 + 1 + 3 * 4 + 2)


@dataclass
class Emulated:
    """How to start a Python rank on aarch64 here: the command before the script, and the
    path it finds numpy and the wheel's rustdist on."""

    command: list[str]
    pythonpath: str


def _unavailable(reason: str) -> None:
    """Skips, or fails where ./dev said that this must run."""
    if os.environ.get("RUSTDIST_AARCH64_REQUIRED") == "1":
        pytest.fail(f"RUSTDIST_AARCH64_REQUIRED=1 but {reason}")
    pytest.skip(reason)


def _wheel() -> Optional[Path]:
    given = os.environ.get("RUSTDIST_AARCH64_WHEEL")
    if given:
        return Path(given) if Path(given).is_file() else None
    found = sorted((REPO / "target" / "wheels-aarch64").glob("rustdist-*aarch64*.whl"))
    return found[-1] if len(found) == 1 else None


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Emulated:
    root_var = os.environ.get("RUSTDIST_AARCH64_ROOT")
    if not root_var:
        pytest.skip("RUSTDIST_AARCH64_ROOT is not set: ./dev test builds the aarch64 wheel and "
                    "root and runs this (see this module's docstring to run it by hand)")
    root = Path(root_var).resolve()
    python = root / "usr" / "bin" / "python3.11"
    if not python.is_file() or not (root / "site" / "numpy").is_dir():
        _unavailable(f"{root} has no aarch64 Python 3.11 and numpy (tools/aarch64_sysroot.py "
                     "builds them)")
    qemu = os.environ.get("RUSTDIST_QEMU_AARCH64") or shutil.which("qemu-aarch64-static")
    if not qemu:
        _unavailable("qemu-aarch64-static is not installed (Debian: apt-get install "
                     "qemu-user-static)")
    wheel = _wheel()
    if wheel is None:
        _unavailable("no aarch64 wheel: set RUSTDIST_AARCH64_WHEEL or build the one wheel in "
                     "target/wheels-aarch64")
    assert wheel is not None and qemu is not None
    # The wheel unpacked is the wheel installed (pure files, no scripts).
    site = tmp_path_factory.mktemp("aarch64-site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    print(f"aarch64 wheel under {qemu}: {wheel.name}")
    return Emulated(command=[qemu, "-L", str(root), str(python), "-s", "-X", "faulthandler"],
                    pythonpath=os.pathsep.join([str(site), str(root / "site"),
                                                str(TESTS / "warn_site")]))


def _run_world(emu: Emulated, transport: str) -> list[dict[str, Any]]:
    """Runs the two ranks to the end; returns their results (fails with their output)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": emu.pythonpath,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        # One thread for numpy's BLAS: each would be an emulated thread.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    if transport == "tcp":
        env["RUSTDIST_SHM"] = "0"
    outputs: list[str] = []
    with reaped() as tag:
        procs = [subprocess.Popen([*emu.command, str(RANK_PROGRAM)],
                                  env={**env, **tag, "RANK": str(rank)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(2)]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out = (p.communicate()[0] or "") + f"\n[killed after {RUN_TIMEOUT_S:.0f} s]"
            outputs.append(out)
    logs = "\n".join(f"--- rank {r} (exit {p.returncode}) ---\n{out[-4000:]}"
                     for r, (p, out) in enumerate(zip(procs, outputs)))
    if any(p.returncode != 0 for p in procs):
        pytest.fail(f"an emulated rank failed ({transport}):\n{logs}")
    results = []
    for out in outputs:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"a rank printed no result:\n{logs}"
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_world_2_collectives_on_numpy_arrays(emulated: Emulated, transport: str) -> None:
    started = time.monotonic()
    results = _run_world(emulated, transport)
    for rank, result in enumerate(results):
        assert result["rank"] == rank and result["machine"] == "aarch64", result
        assert result["checked"] == EXPECTED_CHECKS, result
    algorithms = sorted(results[0]["algorithms"])
    # Which transport ran shows in the algorithms: the workspace ones are named shm*.
    on_shm = [a for a in algorithms if "/shm" in a]
    if transport == "shm":
        assert on_shm, f"no shared-memory algorithm ran: {algorithms}"
    else:
        assert not on_shm, f"shared-memory algorithms ran with RUSTDIST_SHM=0: {algorithms}"
    print(f"{transport}: {EXPECTED_CHECKS} checks per rank passed on aarch64 in "
          f"{time.monotonic() - started:.0f} s; algorithms: {', '.join(algorithms)}")
