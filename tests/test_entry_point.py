"""torch finds the "rustdist" backend by name: ``init_process_group("rustdist")`` in a
program that never imports rustdist, under torchrun (torch 2.14+ loads the registrar named by
the package's ``torch.distributed.backends`` entry point, pyproject.toml). The program is
examples/ddp_mlp.py without its ``import rustdist`` line; it trains DDP and checks that every
rank ends with the same parameters. Needs rustdist installed (its metadata holds the entry
point), as ./dev test does; warnings whose origin is rustdist fail it (warn_guard)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import free_port, run_reaped  # noqa: E402

torch = pytest.importorskip("torch", reason="the torch front door needs torch")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14),
        reason=f"torch {torch.__version__} looks up no backend entry points (2.14+ does): "
               "there a program imports rustdist before init_process_group"),
]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_mlp.py"
IMPORT_LINE = "import rustdist  # noqa: F401 - registers the \"rustdist\" torch.distributed backend\n"


def test_entry_point_in_metadata() -> None:
    """The installed distribution declares the registrar torch loads."""
    points = importlib.metadata.entry_points(group="torch.distributed.backends")
    assert [(p.name, p.value) for p in points if p.name == "rustdist"] == [
        ("rustdist", "rustdist._torch_backend:register")], list(points)


@pytest.mark.parametrize("backend", ["rustdist", "cpu:rustdist,cuda:rustdist"])
def test_torchrun_without_import(tmp_path: Path, backend: str) -> None:
    text = EXAMPLE.read_text()
    assert text.count(IMPORT_LINE) == 1 and text.count('init_process_group("rustdist")') == 1
    program = tmp_path / "ddp_by_name.py"
    program.write_text(text.replace(IMPORT_LINE, "").replace(
        'init_process_group("rustdist")', f'init_process_group("{backend}")'))
    assert not re.search(r"^\s*(import|from)\s+rustdist", program.read_text(), re.M)
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(program)]
    p = run_reaped(cmd, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=200)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "backend " in out and "rustdist" in out and "final loss" in out, out[-4000:]
    assert "origin is rustdist" not in out, out[-4000:]
