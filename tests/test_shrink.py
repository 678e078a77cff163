"""shrink_group: the survivors of a rank that died in the middle of a large collective go on as
a smaller group over the links they have (no rendezvous: it works when the store's rank is the
one that died), through both doors, on shared memory, TCP and the test hosts (the suite runs
again in each mode); a subgroup shrinks alone; pending work is refused or aborted. Cases in
shrink_cases.py. The death-to-first-collective figures are measured by
``python -m rustdist.bench --recovery`` (docs/resilience.md); here they are only bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch

from harness import BACKEND, IS_TORCH, World, free_port, reaped

PROG = Path(__file__).resolve().parent / "shrink_prog.py"

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(IS_TORCH and BACKEND == "gloo",
                       reason="torch's gloo backend does not support shrink_group "
                       "(supports_shrinking is False)"),
]

#: Death of a rank to the survivors' first successful collective on the shrunk group: the
#: death is seen within milliseconds and the shrink takes milliseconds; the bound leaves room
#: for a loaded 2-core machine.
RECOVERY_BOUND_S = 5.0


@pytest.mark.parametrize("world,victim", [(2, 1), (3, 0), (3, 1), (4, 3), (4, 1)])
def test_survivors_shrink_after_a_rank_dies_mid_collective(
        short_world: Callable[..., World], world: int, victim: int) -> None:
    """The survivors are blocked in a 16 MiB all_reduce when `victim` exits; each shrinks the
    default group excluding it and checks every kind of operation on the new default group
    (ranks renumbered, global ranks kept). A group made afterwards works too, unless the store
    was the victim's (rank 0 serves it: nothing is made over it then)."""
    w = short_world(world)
    w.run("warmup")
    survivors = [r for r in range(world) if r != victim]
    case = "shrink_cases:shrink_after_death"
    w.submit(case, ranks=survivors, victim=victim, new_group=victim != 0 and world > 2)
    w.wait_notes(survivors, case)
    t_kill = time.monotonic()
    w.exit_rank(victim)
    results = w.collect(survivors, case, timeout=90)
    for r, res in zip(survivors, results):
        assert f"rank {victim}" in res["error"], f"rank {r}: {res['error']}"
        took = res["t_first"] - t_kill
        assert took < RECOVERY_BOUND_S, (
            f"rank {r}: the first collective on the shrunk group ended {took:.2f} s after "
            f"rank {victim} died (bound {RECOVERY_BOUND_S} s)")


def test_a_subgroup_shrinks_alone(short_world: Callable[..., World]) -> None:
    """World 4, subgroup [1, 2, 3]: rank 3 dies; ranks 1 and 2 shrink the subgroup (group rank
    2 out) and use it; the default group is not replaced."""
    w = short_world(4)
    case = "shrink_cases:shrink_subgroup"
    w.submit(case, members=[1, 2, 3], victim=3)
    w.wait_notes([1, 2, 3], case)
    w.exit_rank(3)
    w.collect([0, 1, 2], case, timeout=60)


def test_pending_work_is_refused_unless_aborted(short_world: Callable[..., World]) -> None:
    """Rank 2 lives but takes no part: with a receive from it pending, SHRINK_DEFAULT raises on
    rank 0 and SHRINK_ABORT aborts the receive and shrinks (the excluded rank is alive)."""
    w = short_world(3)
    w.run("warmup")
    w.run("shrink_cases:shrink_pending", ranks=[0, 1], timeout=60, victim=2)


def _run_world(kind: str, world: int, tmp_path: Path) -> None:
    """Runs shrink_prog.py's `kind` on `world` processes; every one must exit 0 in time."""
    port, procs = free_port(), []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with reaped() as tag:
        for rank in range(world):
            log = open(tmp_path / f"{kind}-{rank}.log", "wb")  # noqa: SIM115 - closed below
            cmd = [sys.executable, str(PROG), kind, str(rank), str(world), str(port),
                   str(tmp_path)]
            procs.append((subprocess.Popen(cmd, env={**env, **tag}, stdout=log,
                                           stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + 90
        for p, log in procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
    failed = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode != 0]
    if failed:
        logs = "\n".join(f"--- rank {r} (exit {code}):\n"
                         f"{(tmp_path / f'{kind}-{r}.log').read_text(errors='replace')[-3000:]}"
                         for r, code in failed)
        pytest.fail(f"{kind}: ranks failed:\n{logs}", pytrace=False)


@pytest.mark.skipif(IS_TORCH, reason="rustdist without torch, in processes of its own; the "
                    "torch doors are the tests above")
def test_without_torch_the_survivors_shrink_their_own_world(tmp_path: Path) -> None:
    """rustdist without torch keeps the world itself: after the last of 3 ranks exits, the
    survivors shrink the default group, check numpy collectives on it (ranks and results) and
    make a new group over the world's store."""
    _run_world("numpy", 3, tmp_path)


@pytest.mark.skipif(IS_TORCH, reason="runs torch's DDP through the torch door in processes of "
                    "its own, once (not a case of the rerun suite)")
def test_ddp_goes_on_without_a_lost_rank(tmp_path: Path) -> None:
    """DDP at world 4 through the torch door: rank 3 exits at step 5; ranks 0-2 catch the
    failed backward, shrink the default group, wrap the model in DDP again and finish every
    step, ending with identical parameters."""
    _run_world("ddp", 4, tmp_path)
    params = [torch.load(tmp_path / f"params-{r}.pt") for r in range(3)]
    for r in (1, 2):
        for k in params[0]:
            torch.testing.assert_close(params[r][k], params[0][k], rtol=0, atol=0,
                                       msg=lambda m, k=k, r=r: f"rank {r}, {k}: {m}")
