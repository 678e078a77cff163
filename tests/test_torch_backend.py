"""rustdist as a torch.distributed backend: torch's own API, DDP, FSDP2, DeviceMesh, DTensor,
functional collectives (eager and compiled) with ``init_process_group("rustdist")``.

Each suite of tests/backend_cases.py runs once per (backend, world) in real processes on
127.0.0.1; every case reports separately. Training cases run on rustdist and on gloo and the
final parameters must agree. One test launches an example with torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

pytestmark = pytest.mark.timeout(300)

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CASES = TESTS / "backend_cases.py"
SUITE_TIMEOUT = 240.0

sys.path.insert(0, str(TESTS))
import backend_cases  # noqa: E402
from harness import free_port, reaped, run_reaped  # noqa: E402
import warn_guard  # noqa: E402

Results = dict[int, dict[str, str]]


def _tail(path: Path, limit: int = 3000) -> str:
    return path.read_text(errors="replace")[-limit:] if path.exists() else ""


def _launch(suite: str, backend: str, world: int, out: Path) -> Results:
    """Runs ``suite`` on ``world`` rank processes; returns each rank's {case: result}."""
    out.mkdir(parents=True)
    port = free_port()
    procs = []
    with reaped() as tag:
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       OMP_NUM_THREADS="1", **tag)
            log = open(out / f"log{rank}.txt", "wb")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, str(CASES), suite, backend,
                                            str(out)], env=env, stdout=log,
                                           stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + SUITE_TIMEOUT
        for p, log in procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
    warned = [r for r, (p, _) in enumerate(procs) if p.returncode == warn_guard.EXIT_CODE]
    if warned:
        pytest.fail(f"suite {suite!r} ({backend}, world {world}): ranks {warned} saw warnings "
                    f"whose origin is rustdist:\n{_tail(out / f'log{warned[0]}.txt')}",
                    pytrace=False)
    results: Results = {}
    for rank in range(world):
        path = out / f"rank{rank}.json"
        if not path.exists():
            logs = "\n".join(f"--- rank {r} (exit {procs[r][0].returncode}):\n"
                             f"{_tail(out / f'log{r}.txt')}" for r in range(world))
            pytest.fail(f"suite {suite!r} ({backend}, world {world}) did not finish:\n{logs}",
                        pytrace=False)
        results[rank] = json.loads(path.read_text())
    return results


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., tuple[Results, Path]]]:
    """run(suite, backend, world): the suite's results (run once per module) and its dir."""
    done: dict[tuple[str, str, int], tuple[Results, Path]] = {}

    def get(suite: str, backend: str, world: int) -> tuple[Results, Path]:
        key = (suite, backend, world)
        if key not in done:
            out = tmp_path_factory.mktemp(f"{suite}-{backend}-{world}")
            done[key] = (_launch(suite, backend, world, out / "run"), out / "run")
        return done[key]

    yield get


def _check(results: Results, case: str) -> None:
    failed = {r: res.get(case, "did not run") for r, res in results.items()
              if res.get(case) != "ok"}
    if failed:
        pytest.fail("\n".join(f"--- rank {r}:\n{tb}" for r, tb in sorted(failed.items())),
                    pytrace=False)


def _names(suite: str) -> list[str]:
    return [c.__name__ for c in backend_cases.SUITES[suite]]


def _same_params(run: Callable[..., tuple[Results, Path]], suite: str, case: str,
                 world: int) -> None:
    """The case passed on rustdist and on gloo, and every rank ends with the same parameters
    in both runs."""
    (ours, ours_dir), (gloo, gloo_dir) = run(suite, "rustdist", world), run(suite, "gloo", world)
    _check(ours, case)
    _check(gloo, case)
    stem = case.removeprefix("case_")
    # fp16-compressed gradients: a 3-way fp16 sum rounds differently in another order
    tol = {"rtol": 1e-3, "atol": 1e-4} if "fp16" in case else {}
    for rank in range(world):
        got = torch.load(ours_dir / f"{stem}-rank{rank}.pt")
        want = torch.load(gloo_dir / f"{stem}-rank{rank}.pt")
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


@pytest.mark.parametrize("case", _names("collectives"))
@pytest.mark.parametrize("world", [2, 3])
def test_collectives(run: Callable[..., Any], world: int, case: str) -> None:
    _check(run("collectives", "rustdist", world)[0], case)


@pytest.mark.parametrize("case", _names("mixed"))
def test_device_backend_string(run: Callable[..., Any], case: str) -> None:
    """``init_process_group("cpu:rustdist,cuda:nccl")`` runs CPU tensors on rustdist."""
    _check(run("mixed", "cpu:rustdist,cuda:nccl", 2)[0], case)


@pytest.mark.parametrize("case", _names("ddp"))
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_matches_gloo(run: Callable[..., Any], world: int, case: str) -> None:
    _same_params(run, "ddp", case, world)


@pytest.mark.parametrize("case", _names("fsdp"))
def test_fsdp2_matches_gloo(run: Callable[..., Any], case: str) -> None:
    _same_params(run, "fsdp", case, 2)


@pytest.mark.parametrize("case", _names("mesh"))
def test_device_mesh_and_dtensor(run: Callable[..., Any], case: str) -> None:
    _check(run("mesh", "rustdist", 4)[0], case)


@pytest.mark.parametrize("case", _names("compiled"))
def test_compiled(run: Callable[..., Any], case: str) -> None:
    _check(run("compiled", "rustdist", 2)[0], case)


def test_torchrun_example(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 examples/ddp_mlp.py --trace DIR`` trains and exits
    cleanly, and each rank's Chrome trace shows DDP's bucket all_reduces (3 profiled steps, a
    bucket each) with their metadata."""
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(ROOT / "examples" / "ddp_mlp.py"),
           "--trace", str(tmp_path / "traces")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = run_reaped(cmd, cwd=tmp_path, env=env, timeout=200)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "backend rustdist" in out and "final loss" in out, out[-4000:]
    for rank in range(2):
        events = json.loads((tmp_path / "traces" / f"rank{rank}.json").read_text())["traceEvents"]
        buckets = [e for e in events if e.get("name") == "rustdist:all_reduce"]
        metas = [e["args"] for e in events if e.get("name") == "rustdist:record_param_comms"
                 and e["args"].get("Collective name") == "all_reduce"]
        assert len(buckets) >= 3 and len(metas) == len(buckets), [e.get("name") for e in events]
        assert all(m["Group size"] == 2 and m["dtype"] == "Float" for m in metas), metas
