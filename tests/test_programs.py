"""Real training programs (examples/: DDP with no_sync and Join over uneven inputs then a
ZeroRedundancyOptimizer; FSDP2 with a torch.distributed.checkpoint save and load; a 2-D
DeviceMesh with DTensor tensor parallelism), each run as written for torch.distributed on
gloo and again with only its import line swapped to ``import rustdist as dist``, under
torchrun and under mp.spawn, at world 2 and 4. Every rank's final parameters must agree
with gloo's to 1e-6."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from harness import free_port, run_reaped

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PROGRAMS = ["ddp_join_zero.py", "fsdp2_checkpoint.py", "dtensor_tp.py"]
TORCH_IMPORT = "import torch.distributed as dist\n"
SWAPPED_IMPORT = "import rustdist as dist\n"
RUN_TIMEOUT = 240


def _program(tmp: Path, name: str, swapped: bool) -> Path:
    """The example (beside its launch helper), with the import line swapped if asked."""
    where = tmp / ("rustdist" if swapped else "gloo")
    where.mkdir()
    shutil.copy(EXAMPLES / "launch.py", where)
    text = (EXAMPLES / name).read_text()
    assert text.count(TORCH_IMPORT) == 1, f"{name} must import torch.distributed as dist once"
    if swapped:
        text = text.replace(TORCH_IMPORT, SWAPPED_IMPORT)
    (where / name).write_text(text)
    return where / name


def _run(program: Path, launcher: str, world: int, out: Path) -> str:
    out.mkdir()
    if launcher == "torchrun":
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(world),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(program)]
    else:
        cmd = [sys.executable, str(program), "--world", str(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = run_reaped([*cmd, "--save-dir", str(out)], cwd=program.parent, env=env,
                   timeout=RUN_TIMEOUT)
    log = p.stdout + p.stderr
    assert p.returncode == 0, f"{program} ({launcher}, world {world}) failed:\n{log[-6000:]}"
    return log


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", PROGRAMS)
def test_swapped_import_matches_gloo(tmp_path: Path, name: str, world: int, launcher: str) -> None:
    results = {}
    for swapped in (False, True):
        program = _program(tmp_path, name, swapped)
        out = tmp_path / f"out-{'rustdist' if swapped else 'gloo'}"
        _run(program, launcher, world, out)
        results[swapped] = out
    for rank in range(world):
        want = torch.load(results[False] / f"params-rank{rank}.pt")
        got = torch.load(results[True] / f"params-rank{rank}.pt")
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6,
                                       msg=lambda m, k=k, r=rank: f"rank {r}, {k}: {m}")
