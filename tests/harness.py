"""Multi-process test harness: long-lived rank processes that run test cases on request.

Starting a rank that imports torch costs seconds, so ranks are forked from a forkserver that
has torch (and rustdist) preloaded, and a world of ranks is started once and reused: the driver
(pytest) sends a case name and parameters to every rank over a pipe, each rank runs
``dist_cases.case_<name>(dist, rank, world, **params)`` and answers ``ok`` (with the case's
return value) or the formatted exception. On a failure, a timeout or a dead rank the driver
fails the test with every rank's answer and the tail of its output, and kills the world; the
next test that needs it starts a fresh one.

``RUSTDIST_TEST_DIST=torch`` runs the same cases against ``torch.distributed`` with backend
gloo, which validates the tests themselves; the default is ``rustdist``. Adding
``RUSTDIST_TEST_BACKEND=rustdist`` runs them through ``torch.distributed`` on rustdist's torch
backend (the expectations stay gloo's where a case branches on the mode).

``RUSTDIST_TEST_HOSTS=HxR`` (e.g. ``2x2``, ``4x1``) places every world's ranks on H test hosts
(network namespaces with hostnames of their own, see ``rustdist._netns``; root needed, else
the tests skip saying why): a world of n ranks fills the hosts in blocks of ceil(n / H) ranks
(2x2: world 4 is two hosts of two ranks, which share memory within a host and use TCP across;
world 2 is one rank per host), and R bounds the ranks per host. MASTER_ADDR is host 0's
address. Each rank process moves onto its host right after it is forked, before any socket.

``RUSTDIST_SHM=0`` (inherited by the ranks) keeps every rank on TCP.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import pytest

MODE: str = os.environ.get("RUSTDIST_TEST_DIST", "rustdist")
if MODE not in ("rustdist", "torch"):
    raise ValueError(f"RUSTDIST_TEST_DIST must be 'rustdist' or 'torch', not {MODE!r}")
IS_TORCH: bool = MODE == "torch"
#: Backend name passed to init_process_group (and expected back from get_backend).
BACKEND: str = os.environ.get("RUSTDIST_TEST_BACKEND", "gloo" if IS_TORCH else "rustdist")
#: How long the driver waits for every rank to answer one case.
CASE_TIMEOUT: float = float(os.environ.get("RUSTDIST_TEST_CASE_TIMEOUT", "60"))
#: Process-group timeout of the shared worlds: a hung collective errors out after this.
PG_TIMEOUT: float = 30.0
#: "HxR": run the worlds on H test hosts (see the module docstring); empty: all on 127.0.0.1.
HOSTS_SPEC: str = os.environ.get("RUSTDIST_TEST_HOSTS", "")

rustdist_only = pytest.mark.skipif(IS_TORCH, reason="rustdist-only")
#: Re-initialising on one port at once races in torch's own TCPStore: a fast rank reaches the
#: previous server while rank 0 is still tearing it down. rustdist's env:// store rejoins the
#: current server, which rustdist mode tests; gloo mode passes only because gloo's teardown is
#: slower on the other ranks.
skip_torch_store_reinit = pytest.mark.skipif(
    IS_TORCH and BACKEND != "gloo",
    reason="torch's TCPStore races when every rank re-initialises on the same port at once",
)
#: torch.distributed refuses monitored_barrier for any backend but gloo (a check on the name).
skip_torch_monitored_barrier = pytest.mark.skipif(
    IS_TORCH and BACKEND != "gloo",
    reason="torch.distributed.monitored_barrier accepts only the gloo backend (by name); "
    "rustdist's own monitored_barrier and group.monitored_barrier are tested in rustdist mode",
)


def skip_if_torch(reason: str) -> pytest.MarkDecorator:
    """Marks a test that torch's gloo backend cannot run; the reason shows in the skip."""
    return pytest.mark.skipif(IS_TORCH, reason=f"rustdist-only: {reason}")


_TAG_VAR = "RUSTDIST_TEST_TAG"


@contextlib.contextmanager
def reaped() -> Iterator[dict[str, str]]:
    """Environment entries that tag every process started with them, and its descendants
    (they inherit the environment); on exit every tagged process still alive is killed, so the
    workers of a launcher that hung or timed out (torchrun puts each in a session of its own,
    out of reach of its parent's kill) never outlive the test."""
    tag = uuid.uuid4().hex
    try:
        yield {_TAG_VAR: tag}
    finally:
        needle = f"{_TAG_VAR}={tag}".encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    tagged = needle in f.read().split(b"\0")
                if tagged:
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue  # gone already, or not ours to read


def run_reaped(cmd: list[str], *, timeout: float, env: Optional[dict[str, str]] = None,
               **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` capturing text output, with every process it starts killed on exit."""
    with reaped() as tag:
        return subprocess.run(cmd, env={**(env if env is not None else os.environ), **tag},
                              capture_output=True, text=True, timeout=timeout, **kwargs)


def parse_hosts_spec(spec: str) -> tuple[int, int]:
    """``"HxR"`` as (hosts, ranks per host)."""
    h, sep, r = spec.lower().partition("x")
    if not (sep and h.isdigit() and r.isdigit() and int(h) >= 1 and int(r) >= 1):
        raise ValueError(f"RUSTDIST_TEST_HOSTS={spec!r}: expected HxR, e.g. 2x2 or 4x1")
    return int(h), int(r)


def placement(world: int, hosts: int, per_host: int) -> list[int]:
    """The host of each rank of a world of `world` ranks on `hosts` hosts: blocks of
    ceil(world / hosts) consecutive ranks, so rank 0 is on host 0."""
    block = -(-world // hosts)
    if block > per_host:
        raise ValueError(f"a world of {world} ranks does not fit on {hosts}x{per_host} hosts")
    return [rank // block for rank in range(world)]


_session_hosts: list[Any] = []


def session_hosts() -> Optional[Any]:
    """The test hosts of RUSTDIST_TEST_HOSTS (a ``rustdist._netns.Hosts``, made once), or None
    when it is unset; skips the calling test when hosts cannot be made here."""
    if not HOSTS_SPEC:
        return None
    if not _session_hosts:
        from rustdist import _netns

        reason = _netns.unavailable_reason()
        if reason:
            pytest.skip(f"RUSTDIST_TEST_HOSTS={HOSTS_SPEC}: {reason}")
        _session_hosts.append(_netns.Hosts(parse_hosts_spec(HOSTS_SPEC)[0]))
    return _session_hosts[0]


def close_session_hosts() -> None:
    """Tears the session's test hosts down (also done at exit)."""
    while _session_hosts:
        _session_hosts.pop().close()


#: Every port this process has handed out: on the test hosts a store listens in a host's
#: namespace, where a check in this one cannot see it, and the shared worlds' stores listen
#: all session ("Address already in use" when a later pick met one, seen in CI).
_handed_out: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 for a world's store (rustdist.bench.launch.free_port: below the
    ephemeral range), never one handed out before in this process. Imported here, not at the
    top: a gloo run's ranks never import rustdist."""
    from rustdist.bench.launch import free_port as pick

    while True:
        port = pick()
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def no_torch_prelude() -> str:
    """The first lines of a numpy-only rank started with ``python -c``: torch made unimportable
    (as where it is not installed) as a scale bench rank makes it, ``scale_rank.hide_torch``
    (loaded as a file: the package ``rustdist.bench`` imports torch)."""
    from rustdist.bench import scale_rank

    folder = os.path.dirname(os.path.abspath(scale_rank.__file__))
    return (f"import sys; sys.path.insert(0, {folder!r}); import scale_rank; "
            "scale_rank.hide_torch(); sys.path.pop(0)\n")


# ---------------------------------------------------------------------------------------------
# Worker side


@dataclass
class WorkerContext:
    """What a case can see besides (dist, rank, world): the mode, a channel to the driver, and
    state kept between the phases of a multi-phase case."""

    mode: str = MODE
    backend: str = BACKEND
    rank: int = -1
    world: int = 0
    pg_timeout: float = PG_TIMEOUT
    state: dict[str, Any] = field(default_factory=dict)
    conn: Any = None

    def notify(self, value: Any) -> None:
        """Sends a note to the driver while the case keeps running (see World.wait_notes)."""
        self.conn.send(("note", value))


ctx = WorkerContext()


def import_dist() -> Any:
    """The module under test: rustdist, or torch.distributed in torch mode."""
    if IS_TORCH:
        import torch.distributed as dist

        if "rustdist" in BACKEND:
            import rustdist  # noqa: F401 - registers the "rustdist" torch.distributed backend
    else:
        import rustdist as dist
    return dist


def init_env(dist: Any, rank: int, world: int, timeout: float) -> None:
    """init_process_group over env:// (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE are set)."""
    from datetime import timedelta

    dist.init_process_group(
        backend=BACKEND,
        init_method="env://",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout),
    )


def find_case(name: str) -> Any:
    """The case function for `name`: ``case_<name>`` of dist_cases, or of another module in
    tests/ when written ``"<module>:<name>"`` (e.g. ``"api_cases:gather"``)."""
    module, _, case = name.rpartition(":")
    return getattr(importlib.import_module(module or "dist_cases"), f"case_{case}")


def _raise_rustdist_warnings() -> None:
    """Fails the case during which a warning whose origin is rustdist came (warn_guard)."""
    guard = sys.modules.get("warn_guard")
    found = guard.take() if guard is not None else []
    if found:
        raise AssertionError("warnings whose origin is rustdist:\n  " + "\n  ".join(found))


def _worker_main(conn: Any, rank: int, world: int, port: int, log_path: str, init: bool,
                 pg_timeout: float, host: Optional[Any] = None,
                 master_addr: str = "127.0.0.1") -> None:
    """Entry point of one rank process: move onto its test host (if any), redirect output,
    init, then serve cases until EOF."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    # A rank that dies of a signal (SIGSEGV in torch or the engine) leaves its threads'
    # Python stacks in its log, whose tail a failure report quotes.
    faulthandler.enable(all_threads=True)
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    ctx.rank, ctx.world, ctx.conn, ctx.pg_timeout = rank, world, conn, pg_timeout
    try:
        if host is not None:
            from rustdist import _netns

            _netns.enter(host)  # still single-threaded, no socket yet
        import torch

        torch.set_num_threads(1)
        dist = import_dist()
        import dist_cases

        if init:
            init_env(dist, rank, world, pg_timeout)
        _raise_rustdist_warnings()
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - everything goes back to the driver
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        name, params = msg
        try:
            fn = find_case(name)
            result = fn(dist, rank, world, **params)
            _raise_rustdist_warnings()
            conn.send(("ok", result))
        except BaseException:  # noqa: BLE001 - everything goes back to the driver
            conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------------------------
# Driver side

_mp: Optional[Any] = None


def _context() -> Any:
    """The forkserver context; its server preloads torch (and rustdist) once per session."""
    global _mp
    if _mp is None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        _mp = multiprocessing.get_context("forkserver")
        preload = ["torch", "torch.distributed", "numpy", "dist_cases"]
        if not IS_TORCH:
            preload.append("rustdist")
        _mp.set_forkserver_preload(preload)
    return _mp


class World:
    """``size`` rank processes serving cases, on 127.0.0.1 or on test hosts (``hosts``, a
    ``rustdist._netns.Hosts``, with rank r on host ``on_hosts[r]``; by default those of
    RUSTDIST_TEST_HOSTS). With ``init`` every rank has called init_process_group over env://
    before the first case."""

    def __init__(self, size: int, init: bool = True, pg_timeout: float = PG_TIMEOUT,
                 log_dir: Optional[str] = None, hosts: Optional[Any] = None,
                 on_hosts: Optional[list[int]] = None) -> None:
        self.size = size
        self.init = init
        self.pg_timeout = pg_timeout
        self.hosts = hosts
        self.on_hosts = on_hosts
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="rustdist-tests-")
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.logs: list[str] = []
        self.port = 0
        #: Where the world's store listens (rank 0's host).
        self.master_addr = "127.0.0.1"
        self.generation = 0
        # Ranks whose answer is outstanding; a test interrupted then (pytest-timeout) leaves
        # some, and the world is restarted rather than reused with stale answers in the pipes.
        self.outstanding: set[int] = set()

    @property
    def alive(self) -> bool:
        return bool(self.procs)

    def start(self) -> None:
        """Starts the ranks and waits until each one is ready (and initialised)."""
        mp = _context()
        hosts = self.hosts if self.hosts is not None else session_hosts()
        on_hosts: list[Optional[Any]] = [None] * self.size
        master_addr = "127.0.0.1"
        if hosts is not None:
            where = self.on_hosts
            if where is None:
                per_host = parse_hosts_spec(HOSTS_SPEC)[1] if self.hosts is None else self.size
                where = placement(self.size, len(hosts), per_host)
            on_hosts = [hosts.host(h) for h in where]
            master_addr = on_hosts[0].addr
        self.generation += 1
        self.master_addr = master_addr
        self.port = free_port()
        self.procs, self.conns, self.logs = [], [], []
        for rank in range(self.size):
            parent, child = mp.Pipe()
            log = os.path.join(self.log_dir, f"w{self.size}-g{self.generation}-r{rank}.log")
            p = mp.Process(target=_worker_main, name=f"rank{rank}", daemon=True,
                           args=(child, rank, self.size, self.port, log, self.init,
                                 self.pg_timeout, on_hosts[rank], master_addr))
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
            self.logs.append(log)
        self._collect(list(range(self.size)), CASE_TIMEOUT, "startup")

    def ensure(self) -> "World":
        if self.outstanding:
            self.kill()
        if not self.alive:
            self.start()
        return self

    def close(self) -> None:
        """Stops every rank (politely, then by force)."""
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 3
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []
        self.outstanding = set()

    # -- running cases --------------------------------------------------------------------

    def submit(self, name: str, ranks: Optional[list[int]] = None,
               per_rank: Optional[dict[int, dict[str, Any]]] = None, alongside: bool = False,
               **params: Any) -> list[int]:
        """Sends case `name` to `ranks` (default all); `per_rank[r]` overrides params of rank r.

        With `alongside`, other ranks may still be running a case this test submitted (their
        answers are collected later); otherwise a world with answers outstanding is restarted
        first (a test interrupted then left them)."""
        ranks = list(range(self.size)) if ranks is None else ranks
        if alongside:
            busy = self.outstanding.intersection(ranks)
            if not self.alive or busy:
                raise RuntimeError(f"submit({name!r}, alongside=True): world not started, or "
                                   f"ranks {sorted(busy)} still run a case")
        else:
            self.ensure()
        self.outstanding.update(ranks)
        for r in ranks:
            p = dict(params)
            if per_rank and r in per_rank:
                p.update(per_rank[r])
            self.conns[r].send((name, p))
        return ranks

    def collect(self, ranks: list[int], name: str, timeout: float = CASE_TIMEOUT) -> list[Any]:
        """Waits for the answers of `ranks` to case `name`; returns their values in order."""
        return self._collect(ranks, timeout, name)

    def run(self, name: str, ranks: Optional[list[int]] = None, timeout: float = CASE_TIMEOUT,
            per_rank: Optional[dict[int, dict[str, Any]]] = None, alongside: bool = False,
            **params: Any) -> list[Any]:
        """Runs case `name` on `ranks` (default all) and returns each rank's return value
        (`alongside`: see submit)."""
        ranks = self.submit(name, ranks, per_rank, alongside, **params)
        return self._collect(ranks, timeout, name)

    def wait_notes(self, ranks: list[int], name: str, timeout: float = CASE_TIMEOUT) -> list[Any]:
        """Waits for one WorkerContext.notify() value from each of `ranks`."""
        return self._collect(ranks, timeout, name, kind="note")

    def exit_rank(self, rank: int, timeout: float = 10.0) -> None:
        """Makes `rank` call os._exit(1) and waits until the process is gone."""
        self.conns[rank].send(("exit", {}))
        self.procs[rank].join(timeout)
        if self.procs[rank].is_alive():
            self._fail(f"rank {rank} did not exit", {})

    def _collect(self, ranks: list[int], timeout: float, name: str,
                 kind: str = "ok") -> list[Any]:
        answers: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        pending = set(ranks)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            for obj in multiprocessing.connection.wait(waitables, left):
                for r in list(pending):
                    if obj is self.conns[r]:
                        try:
                            answers[r] = self.conns[r].recv()
                        except (EOFError, OSError):
                            self.procs[r].join(1)
                            answers[r] = ("died", f"exit code {self.procs[r].exitcode}")
                        pending.discard(r)
                    elif obj == self.procs[r].sentinel and not self.conns[r].poll():
                        self.procs[r].join(1)
                        answers[r] = ("died", f"exit code {self.procs[r].exitcode}")
                        pending.discard(r)
        for r in pending:
            answers[r] = ("timeout", f"no answer within {timeout:.0f} s")
        if any(status != kind for status, _ in answers.values()):
            self._fail(f"case {name!r} failed on world {self.size}", answers)
        if kind == "ok":
            self.outstanding.difference_update(ranks)
        return [answers[r][1] for r in ranks]

    def _fail(self, what: str, answers: dict[int, tuple[str, Any]]) -> None:
        lines = [what]
        for r in sorted(answers):
            status, value = answers[r]
            if status in ("ok", "note"):
                lines.append(f"--- rank {r}: {status}")
            else:
                lines.append(f"--- rank {r}: {status}\n{value}")
        self.kill()
        for r, log in enumerate(self.logs):
            tail = _tail(log)
            if tail:
                lines.append(f"--- rank {r} output (tail):\n{tail}")
        pytest.fail("\n".join(lines), pytrace=False)


def _tail(path: str, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""
