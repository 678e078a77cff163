"""``import rustdist as dist; dist.init_process_group()`` (tests/launch_prog.py) under every
launcher: torchrun --standalone, torchrun's c10d rendezvous with two "nodes" on 127.0.0.1,
torchrun --max-restarts 1 re-forming the group after a worker died, Slurm's srun variables
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) and Open MPI's mpirun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import free_port, reaped, run_reaped

pytestmark = pytest.mark.timeout(240)

PROG = str(Path(__file__).resolve().parent / "launch_prog.py")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TIMEOUT = 180
#: Variables a launcher sets; the tests start from an environment without them.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                 "TORCHELASTIC_USE_AGENT_STORE")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _check(outputs: list[str], world: int, attempt: int = 0) -> None:
    text = "\n".join(outputs)
    for rank in range(world):
        assert f"rank {rank} of {world}," in text and f"attempt {attempt}: ok" in text, text[-6000:]


def _run(cmd: list[str], env: dict[str, str]) -> str:
    p = run_reaped(cmd, env=env, timeout=TIMEOUT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    return p.stdout + p.stderr


def test_torchrun_standalone() -> None:
    out = _run([TORCHRUN, "--standalone", "--nproc-per-node", "2", PROG], _env())
    _check([out], 2)


def test_torchrun_c10d_two_nodes() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", endpoint, "--rdzv-id", "launcher-test", PROG]
    with reaped() as tag:
        nodes = [subprocess.Popen(cmd, env=_env(**tag), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        outputs = [node.communicate(timeout=TIMEOUT)[0] for node in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(outputs)[-6000:]
    _check(outputs, 2)


def test_torchrun_restart_after_worker_died() -> None:
    out = _run([TORCHRUN, "--nproc-per-node", "2", "--max-restarts", "1", "--master-addr",
                "127.0.0.1", "--master-port", str(free_port()), PROG, "--die-in-first-attempt"],
               _env())
    _check([out], 2, attempt=1)
    assert "attempt 0: ok" not in out, out[-6000:]


def test_slurm_variables() -> None:
    port = str(free_port())
    with reaped() as tag:
        procs = [subprocess.Popen([sys.executable, PROG], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env=_env(SLURM_PROCID=str(r), SLURM_NTASKS="2",
                                           SLURM_LOCALID=str(r), MASTER_ADDR="127.0.0.1",
                                           MASTER_PORT=port, **tag))
                 for r in range(2)]
        outputs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)[-6000:]
    _check(outputs, 2)
    assert "rank 1 of 2, local rank 1" in "\n".join(outputs)


@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="mpirun is not installed (Debian's openmpi-bin; ./dev installs it)")
def test_mpirun() -> None:
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
           "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
           "-x", "OMP_NUM_THREADS=1", sys.executable, PROG]
    out = _run(cmd, _env())
    _check([out], 2)
    assert "rank 1 of 2, local rank 1" in out, out[-6000:]
