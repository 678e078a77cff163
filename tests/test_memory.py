"""No memory held past completion: 10,000 all_gather_into_tensor calls into fresh 1 MiB
outputs, which the caller drops at once, on both front doors and on gloo in the same test
(world 2, tests/memory_prog.py). Every rank's resident memory at the end, and at its peak,
stays within 5% of gloo's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import free_port, reaped

pytestmark = pytest.mark.timeout(400)

PROG = str(Path(__file__).resolve().parent / "memory_prog.py")
ITERATIONS = 10_000
WORLD = 2
#: Allowed excess over gloo's resident memory.
SLACK = 0.05


def _measure(door: str, tmp: Path) -> list[dict[str, float]]:
    port = str(free_port())
    with reaped() as tag:
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                       WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", **tag)
            out = tmp / f"{door}-{rank}.json"
            procs.append((subprocess.Popen([sys.executable, PROG, door, str(ITERATIONS),
                                            str(out)], env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True), out))
        results = []
        for p, out in procs:
            log = p.communicate(timeout=300)[0]
            assert p.returncode == 0, f"{door}: {log[-4000:]}"
            results.append(json.loads(out.read_text()))
    return results


def test_fresh_outputs_are_released(tmp_path: Path) -> None:
    gloo = _measure("gloo", tmp_path)
    problems = []
    for door in ("rustdist", "torch"):
        ours = _measure(door, tmp_path)
        for rank, (g, o) in enumerate(zip(gloo, ours)):
            for what in ("after", "peak"):
                if o[what] > g[what] * (1 + SLACK):
                    problems.append(f"{door} door, rank {rank}: {what} RSS {o[what]:.0f} MiB vs "
                                    f"gloo's {g[what]:.0f} MiB (before the loop: "
                                    f"{o['before']:.0f} vs {g['before']:.0f} MiB)")
    assert not problems, "\n".join(problems)
