"""Starting the ranks of one world and following what they report.

The launcher writes the world's :class:`Config` to a fresh run folder and starts one process
per rank running ``python -m rustdist.bench.rank RUN_FOLDER``, either itself (through a
:data:`Launcher`, replaceable: a launcher that wraps each command in ``ip netns exec`` runs
the ranks in network namespaces) or as one ``mpirun`` job. Each rank appends JSON lines to
``rank<r>.jsonl`` in the run folder (:class:`Emitter`); the launcher follows those files
(:class:`Follower`) while the ranks run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from .common import Config

#: Starts one process per rank: ``commands[r]`` with environment ``envs[r]``, and returns
#: Popen-like handles (``poll``, ``wait``, ``terminate``, ``kill``).
Launcher = Callable[[Sequence[Sequence[str]], Sequence[Mapping[str, str]]], list[Any]]
#: How long the other ranks may take to exit after one failed before they are stopped.
FAIL_GRACE_S = 10.0
CONFIG_FILE = "config.json"


def start_ranks(commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]]
                ) -> list[subprocess.Popen]:
    """The default :data:`Launcher`: local child processes."""
    return [subprocess.Popen(list(cmd), env=dict(env), stdin=subprocess.DEVNULL)
            for cmd, env in zip(commands, envs)]


def mpi_problem() -> Optional[str]:
    """Why ``--vs mpi`` cannot run here (mpirun or mpi4py missing), or None."""
    if shutil.which("mpirun") is None:
        return ("--vs mpi needs Open MPI's mpirun: apt-get install openmpi-bin "
                "(./dev bench installs mpi4py into .venv)")
    try:
        import mpi4py

        # Loads libmpi without MPI_Init: only the ranks join an MPI world.
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI  # noqa: F401
    except ImportError as e:
        return (f"--vs mpi needs mpi4py with an MPI library ({e}): ./dev bench installs mpi4py "
                "into .venv (or pip install mpi4py); Open MPI: apt-get install openmpi-bin")
    return None


def mpi_version() -> str:
    """The first line of the MPI library's version string (after :func:`mpi_problem`)."""
    from mpi4py import MPI

    return MPI.Get_library_version().strip("\x00 \n").splitlines()[0]


#: The lowest port :func:`free_port` picks (above the registered ports most services use).
LOWEST_PICKED_PORT = 20000


def _ephemeral_ports_start() -> int:
    """The first port the kernel hands to outgoing connections (32768 unless configured)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that was free a moment ago, for a store to listen on soon.

    Picked at random below the kernel's ephemeral range: a port bind(0) reports free comes
    from the range the kernel also gives outgoing connections, and one of those (any process's)
    can take it before the store listens ("Address already in use", seen in CI)."""
    start = _ephemeral_ports_start()
    pick = random.SystemRandom()  # not the module's generator: forked callers share its state
    if start > LOWEST_PICKED_PORT + 1000:  # else the range was configured to leave no room
        for _ in range(64):
            port = pick.randrange(LOWEST_PICKED_PORT, start)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _rank_command(run_dir: str) -> list[str]:
    return [sys.executable, "-m", "rustdist.bench.rank", run_dir]


def _env(**extra: str) -> dict[str, str]:
    # One intra-op thread per rank: more would only compete with the ranks for the cores.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _start(cfg: Config, run_dir: str, launcher: Launcher) -> list[Any]:
    if cfg.mpi:
        mpirun = shutil.which("mpirun") or "mpirun"
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(cfg.world),
               *_rank_command(run_dir)]
        return [subprocess.Popen(cmd, env=_env(), stdin=subprocess.DEVNULL)]
    return launcher([_rank_command(run_dir)] * cfg.world,
                    [_env(RANK=str(r), WORLD_SIZE=str(cfg.world)) for r in range(cfg.world)])


class Emitter:
    """A rank's side: appends one JSON object per line to ``rank<r>.jsonl``."""

    def __init__(self, run_dir: str, rank: int) -> None:
        self.rank = rank
        self._f = open(os.path.join(run_dir, f"rank{rank}.jsonl"), "a", encoding="utf-8")

    def emit(self, event: str, **fields: Any) -> None:
        """Writes ``{"event": event, "rank": rank, **fields}`` as one line, at once."""
        self._f.write(json.dumps({"event": event, "rank": self.rank, **fields}) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Closes the file."""
        self._f.close()


class Follower:
    """The launcher's side: the complete lines the ranks have appended since the last poll."""

    def __init__(self, run_dir: str, world: int) -> None:
        self._paths = [os.path.join(run_dir, f"rank{r}.jsonl") for r in range(world)]
        self._offsets = [0] * world

    def poll(self) -> list[dict[str, Any]]:
        """New events of every rank (a half-written last line waits for the next poll)."""
        events = []
        for r, path in enumerate(self._paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[r])
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self._offsets[r] += len(complete)
            events += [json.loads(line) for line in complete.splitlines()]
        return events


def run_world(cfg: Config, on_event: Callable[[dict[str, Any]], None],
              launcher: Launcher = start_ranks,
              on_poll: Optional[Callable[[], None]] = None) -> list[dict[str, Any]]:
    """Runs one world of `cfg.world` ranks to the end, calling `on_event` with each event as it
    arrives (and `on_poll` between polls, every 50 ms); returns every event. Raises
    RuntimeError when a rank fails (its traceback is already on stderr)."""
    with tempfile.TemporaryDirectory(prefix="rustdist-bench-") as run_dir:
        with open(os.path.join(run_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(cfg.to_json())
        follower = Follower(run_dir, cfg.world)
        events: list[dict[str, Any]] = []
        handles = _start(cfg, run_dir, launcher)
        failed_at: Optional[float] = None
        try:
            while True:
                codes = [h.poll() for h in handles]
                for ev in follower.poll():
                    events.append(ev)
                    on_event(ev)
                if all(c is not None for c in codes):
                    break
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = time.monotonic()
                if failed_at is not None and time.monotonic() - failed_at > FAIL_GRACE_S:
                    break
                if on_poll is not None:
                    on_poll()
                time.sleep(0.05)
        finally:
            stop(handles)
        codes = [h.poll() for h in handles]
        if any(codes):
            raise RuntimeError(f"world {cfg.world}: ranks exited with {codes}")
        return events


def stop(handles: list[Any]) -> None:
    """Stops the handles still running: terminate, then kill."""
    for h in handles:
        if h.poll() is None:
            h.terminate()
    for h in handles:
        try:
            h.wait(timeout=5)
        except subprocess.TimeoutExpired:
            h.kill()
            h.wait()
