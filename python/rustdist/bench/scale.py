"""``--scale``: what a world of W ranks costs, W = 8 ... 512: the time to start it, and per
rank the threads, fds, memory and idle CPU it holds, and the latency of small collectives.

Per world size and side the launcher starts W rank processes (``scale_rank.py``; a rustdist
rank imports rustdist and numpy without torch, about 35 MB, so hundreds fit in memory), with
env:// rendezvous on a free port of 127.0.0.1. When every rank has imported its side and said
so, the launcher writes a common start instant (wall clock, a moment ahead); every rank sleeps
until it and enters ``init_process_group`` (``"rustdist"``; the gloo sides: torch's
``"gloo"``, once as it is and once with ``TORCH_GLOO_LAZY_INIT=1``). Figures, over the ranks:

* init: from the common start to the end of ``init_process_group``, the slowest rank's; the
  world is started ``--scale-starts`` times (default 3, the earlier starts only init and run
  the first collective) and the figure is the median over the starts;
* first collective: from the common start to the end of a first 8 B all_reduce, the slowest
  rank's, median over the starts (a lazy side makes its connections here);
* threads (``/proc/self/task``), open fds (``/proc/self/fd``, the rank's two bench files and
  stdio included) and RSS (``VmRSS``) after the first collective: max and median;
* idle CPU: after a barrier every rank sleeps ``--scale-idle`` seconds; the process's CPU time
  (user + system, every thread: CLOCK_PROCESS_CPUTIME_ID) in that window over its length, in
  % of a core: mean and max;
* latency of an 8 B all_reduce (float32 x 2), a barrier and a 1 MiB all_reduce: an all_reduce
  is first checked element by element on every rank (a case wrong on any rank is reported,
  not timed); then rounds of a barrier and N back-to-back calls (N shrinks with W), a round's
  time is the slowest rank's mean per call, and the figure is the median over the rounds.

A row's status: "ok"; "did not start" (a rank failed, or not every rank finished init within
``--scale-timeout``); "failed" (after init); "failed at exit" (every figure measured, then the
last barrier or ``destroy_process_group`` failed); "wrong result" (reported, not timed);
"skipped" (would not fit in memory). A world that does not end well is stopped, its ranks
killed, and its row carries the first lines a rank wrote to stderr (every rank's stderr goes
to ``<json>-logs/``); the bench goes on with the next world. Ranks die with the bench
(``PR_SET_PDEATHSIG``), so none outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, Optional

from . import plot, scale_model, scale_rank
from .launch import FAIL_GRACE_S, Follower, Launcher, free_port, start_ranks, stop
from .progress import Progress

MASTER_ADDR = "127.0.0.1"
SIDES = ("rustdist", "gloo", "gloo_lazy")
LABELS = {"gloo": "gloo", "gloo_lazy": "gloo lazy"}
#: The latency cases: (name, op, float32 elements, calls per round at world 8; fewer at larger
#: worlds, in proportion, but at least MIN_CALLS).
CASES = (("all_reduce_8B", "all_reduce", 2, 400), ("barrier", "barrier", 0, 400),
         ("all_reduce_1MiB", "all_reduce", 1 << 18, 40))
MIN_CALLS = 5
#: How much of a failed world's ranks' stderr is kept next to the JSON.
LOG_BYTES = 256 << 10
#: What a rank of each kind holds (MB: the median RSS measured, 35-37 and 576-581; RSS counts
#: the shared libraries in every rank, so this errs high), to skip a world that
#: would not fit in memory.
RANK_MB = {"rustdist": 37, "gloo": 650}
#: The figures, each a PNG against the world size: (key, axis label, log scale).
FIGURES = (("init_s", "init (s), slowest rank, median of starts", True),
           ("first_collective_s", "to the end of the first collective (s)", True),
           ("threads", "threads per rank", False), ("fds", "open fds per rank", False),
           ("rss_mb", "RSS per rank (MB)", False),
           ("idle_cpu_pct", "idle CPU per rank (% of a core)", False),
           ("all_reduce_8B_us", "8 B all_reduce (us)", True),
           ("barrier_us", "barrier (us)", True),
           ("all_reduce_1MiB_us", "1 MiB all_reduce (us)", True))
#: The rank's boot: the rank module runs as a file (see scale_rank.py).
BOOT = ("import runpy, sys; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``--scale``."""
    p.add_argument("--scale", action="store_true",
                   help="the cost of a world against its size: init, first collective, "
                        "threads, fds, RSS and idle CPU per rank, small collectives' latency "
                        "(rustdist ranks without torch; gloo where it fits)")
    p.add_argument("--scale-sides", nargs="+", choices=SIDES, default=list(SIDES),
                   help="--scale: the sides (default: all; gloo ones only up to "
                        "--gloo-max-world)")
    p.add_argument("--gloo-max-world", type=int, default=16,
                   help="--scale: the largest world of gloo ranks (torch, ~600 MB each; "
                        "default 16)")
    p.add_argument("--shm", type=int, nargs="+", choices=[0, 1],
                   help="--scale: rustdist with shared memory (1) and/or TCP only (0: "
                        "RUSTDIST_SHM=0); default 1, or 0 where RUSTDIST_SHM=0 is set")
    p.add_argument("--scale-hosts", type=int, metavar="K",
                   help="--scale: hosts of K ranks each (rank r on host r // K): "
                        "RUSTDIST_HOST_ID per rank, shared memory inside a host and TCP "
                        "between; with --link, test hosts of K ranks (default 1)")
    p.add_argument("--scale-idle", type=float, default=3.0, metavar="S",
                   help="--scale: seconds every rank sits idle for the idle CPU (default 3)")
    p.add_argument("--scale-rounds", type=int, default=5,
                   help="--scale: timed rounds per latency case (default 5; 3 with --quick)")
    p.add_argument("--scale-starts", type=int, default=3, metavar="N",
                   help="--scale: start each world N times; init and the first collective "
                        "are the median over the starts, the rest is measured in the last "
                        "(default 3)")
    p.add_argument("--scale-timeout", type=float, metavar="S",
                   help="--scale: seconds a world may take to start, from the common start "
                        "(default 60 + W/4)")
    p.add_argument("--model", nargs="+", metavar="JSON",
                   help="--scale: run nothing; project 1k-100k ranks from these measured "
                        "--scale results (scale_model.py says how)")
    p.add_argument("--model-latency-us", type=float, default=scale_model.REFERENCE_LATENCY_US,
                   help="--model: the links' one-way latency (default: the engine's reference "
                        "link, TCP loopback, 40 us)")
    p.add_argument("--model-bandwidth", type=float, default=scale_model.REFERENCE_BANDWIDTH,
                   help="--model: the links' bandwidth in bytes/s (default 2e9)")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Errors in the ``--scale`` options (through `p`); fills in the defaults."""
    if (args.gloo_max_world < 0 or args.scale_idle <= 0 or args.scale_rounds < 1
            or args.scale_starts < 1):
        p.error("--gloo-max-world >= 0, --scale-idle > 0, --scale-rounds >= 1 and "
                "--scale-starts >= 1")
    if args.scale_hosts is not None and args.scale_hosts < 1:
        p.error("--scale-hosts K needs K >= 1")
    if args.scale_timeout is not None and args.scale_timeout <= 0:
        p.error("--scale-timeout must be positive")
    if args.shm is None:
        args.shm = [0] if os.environ.get("RUSTDIST_SHM") == "0" else [1]
    if args.quick:
        args.scale_rounds = min(args.scale_rounds, 3)


def sides_of(args: argparse.Namespace, world: int) -> list[dict[str, Any]]:
    """The sides that run at `world`: rustdist once per --shm value, gloo where it fits."""
    where = ""
    if args.link:
        where = f", test hosts of {args.scale_hosts or 1}, {args.link}"
    elif args.scale_hosts:
        where = f", hosts of {args.scale_hosts}"
    out = []
    if "rustdist" in args.scale_sides:
        for shm in args.shm:
            out.append({"side": "rustdist", "shm": shm,
                        "label": f"rustdist {'shm' if shm else 'tcp'}{where}"})
    for side in ("gloo", "gloo_lazy"):
        if side in args.scale_sides and world <= args.gloo_max_world:
            out.append({"side": side, "shm": None,
                        "label": LABELS[side] + (where if args.link else "")})
    return out


def calls_at(world: int, at_8: int) -> int:
    """Calls per round at `world` of a case that makes `at_8` at world 8."""
    return max(MIN_CALLS, at_8 * 8 // max(8, world))


def start_timeout(args: argparse.Namespace, world: int) -> float:
    """Seconds a world may take from the common start to every rank's end of init."""
    return args.scale_timeout if args.scale_timeout is not None else 60 + world / 4


def mem_available_mb() -> Optional[float]:
    """MemAvailable of /proc/meminfo, in MB (None where unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def placement(args: argparse.Namespace, world: int) -> Iterator[tuple[str, Launcher]]:
    """Where the ranks run: (MASTER_ADDR, launcher). Local processes, or with ``--link`` test
    hosts of ``--scale-hosts`` ranks each (rank r on host r // K), links shaped, torn down
    afterwards."""
    if not args.link:
        yield MASTER_ADDR, start_ranks
        return
    from .. import _netns

    per_host = args.scale_hosts or 1
    with _netns.Hosts(-(-world // per_host)) as hosts:
        hosts.shape(rate=args.link, delay_ms=args.delay)

        def launch(commands: Any, envs: Any) -> list[subprocess.Popen[Any]]:
            return [hosts.popen(r // per_host, list(cmd), stdin=subprocess.DEVNULL,
                                env={**env, "GLOO_SOCKET_IFNAME": "eth0"})
                    for r, (cmd, env) in enumerate(zip(commands, envs))]

        yield hosts.addr(0), launch


def rank_envs(args: argparse.Namespace, side: dict[str, Any], world: int, addr: str,
              port: int) -> list[dict[str, str]]:
    """Each rank's environment."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "TORCH_GLOO_LAZY_INIT", "RUSTDIST_HOST_ID")}
    base.update(MASTER_ADDR=addr, MASTER_PORT=str(port), WORLD_SIZE=str(world),
                OMP_NUM_THREADS="1", RUSTDIST_SCALE_PARENT=str(os.getpid()))
    if side["shm"] is not None:
        base["RUSTDIST_SHM"] = str(side["shm"])
    if side["side"] == "gloo_lazy":
        base["TORCH_GLOO_LAZY_INIT"] = "1"
    envs = []
    for r in range(world):
        env = dict(base, RANK=str(r))
        if args.scale_hosts and not args.link:
            env["RUSTDIST_HOST_ID"] = f"h{r // args.scale_hosts}"
        envs.append(env)
    return envs


def stderr_files(run_dir: str, ranks: list[int]) -> list[tuple[int, list[str]]]:
    """(rank, lines) of the ranks of `ranks` that wrote to stderr, the first to stop writing
    first (the rank whose error came first, most often)."""
    found = []
    for r in ranks:
        path = os.path.join(run_dir, f"rank{r}.err")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [ln.rstrip() for ln in f if ln.strip()]
            if lines:
                found.append((os.path.getmtime(path), r, lines))
        except OSError:
            continue
    return [(r, lines) for _, r, lines in sorted(found)]


def error_lines(run_dir: str, ranks: list[int], limit: int = 4) -> list[str]:
    """The first lines a rank of `ranks` wrote to stderr (a traceback's frames skipped, its
    exception kept), from the rank that wrote first."""
    for r, lines in stderr_files(run_dir, ranks):
        kept = [ln for ln in lines if not ln.startswith((" ", "Traceback"))]
        if kept:
            return [f"rank {r}: {ln[:300]}" for ln in kept[:limit]]
    return []


def keep_logs(run_dir: str, world: int, path: str) -> Optional[str]:
    """Every rank's stderr, in the order they stopped writing, into `path` (at most
    LOG_BYTES); the path, or None when no rank wrote any."""
    found = stderr_files(run_dir, list(range(world)))
    if not found:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    text = "".join(f"== rank {r} ==\n" + "\n".join(lines) + "\n" for r, lines in found)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:LOG_BYTES])
    return path


class World:
    """One side's world of W ranks, run to its end or stopped: its events by rank, and how it
    ended."""

    def __init__(self, args: argparse.Namespace, side: dict[str, Any], world: int,
                 progress: Progress, init_only: bool = False) -> None:
        self.args, self.side, self.world, self.progress = args, side, world, progress
        self.init_only = init_only
        self.events: dict[str, dict[int, dict[str, Any]]] = {}
        self.cases: dict[int, list[dict[str, Any]]] = {}
        self.calls: Optional[dict[str, int]] = None
        self.log: Optional[str] = None
        self.status = "ok"
        self.error: list[str] = []

    def _poll(self, follower: Follower) -> None:
        for ev in follower.poll():
            kind = ev.pop("event")
            if kind == "case":  # several per rank
                self.cases.setdefault(ev["rank"], []).append(ev)
            else:
                self.events.setdefault(kind, {})[ev["rank"]] = ev

    def _count(self, event: str) -> int:
        return len(self.events.get(event, {}))

    def _wait(self, handles: list[Any], follower: Follower, event: str,
              deadline: float) -> Optional[str]:
        """Polls until every rank sent `event`; why not (a rank exited, or the deadline)."""
        while True:
            codes = [h.poll() for h in handles]  # before the events: an exited rank's are in
            self._poll(follower)
            if self._count(event) == self.world:
                return None
            failed = [r for r, c in enumerate(codes) if c is not None
                      and (c != 0 or r not in self.events.get(event, {}))]
            if failed:
                time.sleep(0.5)  # the others' errors, if any, reach their files
                self._poll(follower)
                return f"rank(s) {failed[:8]} exited ({codes[failed[0]]})"
            if time.monotonic() > deadline:
                return f"{self._count(event)} of {self.world} ranks got there in time"
            self.progress.tick()
            time.sleep(0.1)

    def run(self) -> None:
        """Starts the ranks, gives them the common start, follows them; stops them all."""
        world, args = self.world, self.args
        with tempfile.TemporaryDirectory(prefix="rustdist-scale-") as run_dir, \
                placement(args, world) as (addr, launcher):
            cases = [{"name": n, "op": op, "elems": e, "calls": calls_at(world, at8)}
                     for n, op, e, at8 in CASES]
            timeout = start_timeout(args, world)
            cfg = {"side": "rustdist" if self.side["side"] == "rustdist" else "gloo",
                   "world": world, "idle_s": args.scale_idle, "rounds": args.scale_rounds,
                   "cases": cases, "timeout_s": timeout, "init_only": self.init_only}
            self.calls = {c["name"]: c["calls"] for c in cases}
            with open(os.path.join(run_dir, scale_rank.CONFIG_FILE), "w",
                      encoding="utf-8") as f:
                json.dump(cfg, f)
            port = free_port(addr) if addr == MASTER_ADDR else 29500
            cmd = [sys.executable, "-c", BOOT, scale_rank.__file__, run_dir]
            follower = Follower(run_dir, world)
            handles = launcher([cmd] * world, rank_envs(args, self.side, world, addr, port))
            try:
                self._follow(handles, follower, run_dir, timeout)
            finally:
                stop(handles)
            if self.status != "ok":
                if not self.error[1:]:
                    self.error += error_lines(run_dir, list(range(world)))
                stem = args.json[:-5] if args.json.endswith(".json") else args.json
                name = self.side["label"].replace(" ", "-").replace(",", "")
                self.log = keep_logs(run_dir, world, f"{stem}-logs/w{world}-{name}.txt")

    def _follow(self, handles: list[Any], follower: Follower, run_dir: str,
                timeout: float) -> None:
        world = self.world
        self.progress.update(label=f"world {world} {self.side['label']}: importing")
        per_rank = 0.3 if self.side["side"] == "rustdist" else 3.0  # import: numpy or torch
        why = self._wait(handles, follower, "ready", time.monotonic() + 30 + per_rank * world)
        if why:
            self._fail("did not start", f"before init: {why}", run_dir, handles)
            return
        start_at = time.time() + 0.5 + 0.004 * world
        tmp = os.path.join(run_dir, "start.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"start_at": start_at}, f)
        os.replace(tmp, os.path.join(run_dir, scale_rank.START_FILE))
        self.progress.update(label=f"world {world} {self.side['label']}: init")
        t0 = time.monotonic() + (start_at - time.time())
        why = self._wait(handles, follower, "init", t0 + timeout + 5)
        if why:
            self._fail("did not start", f"init within {timeout:g} s: {why}", run_dir,
                       handles)
            return
        self.progress.update(label=f"world {world} {self.side['label']}: measuring")
        deadline = time.monotonic() + 120 + 2 * world
        why = self._wait(handles, follower, "measured", deadline)
        if why:
            self._fail("failed", f"after init: {why}", run_dir, handles)
            return
        why = self._wait(handles, follower, "done", deadline)
        if why:
            self._fail("failed at exit", "measured, then failed in the last barrier or "
                       f"destroy_process_group: {why}", run_dir, handles)
            return
        grace = time.monotonic() + FAIL_GRACE_S
        while any(h.poll() is None for h in handles) and time.monotonic() < grace:
            time.sleep(0.05)
        codes = [h.poll() for h in handles]
        if any(codes):
            self._fail("failed at exit", f"exit codes {sorted(set(codes), key=str)}", run_dir,
                       handles)

    def _fail(self, status: str, why: str, run_dir: str, handles: list[Any]) -> None:
        self.status = status
        codes = [h.poll() for h in handles]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        self.error = [why] + error_lines(run_dir, failed)

    def row(self) -> dict[str, Any]:
        """The world's row: how it ended and its figures over the ranks."""
        row: dict[str, Any] = {"world": self.world, "side": self.side["side"],
                               "label": self.side["label"], "shm": self.side["shm"],
                               "hosts_of": self.args.scale_hosts, "link": self.args.link,
                               "status": self.status, "error": self.error or None,
                               "stderr_log": self.log,
                               "calls": self.calls,
                               "rounds": self.args.scale_rounds}
        ev = self.events
        if "ready" in ev:
            row["import_s_max"] = max(e["import_s"] for e in ev["ready"].values())
        if self._count("init") == self.world:
            init = ev["init"].values()
            row["init_s"] = max(e["init_s"] for e in init)
            row["init_s_median"] = statistics.median(e["init_s"] for e in init)
            row["late_s_max"] = max(e["late_s"] for e in init)
        if self._count("first") == self.world:
            row["first_collective_s"] = max(e["first_s"] for e in ev["first"].values())
            row["first_correct"] = all(e["ok"] for e in ev["first"].values())
        if self._count("resources") == self.world:
            for key in ("threads", "fds", "rss_mb"):
                by_rank = {r: e[key] for r, e in ev["resources"].items()}
                row[key] = max(by_rank.values())
                row[f"{key}_median"] = statistics.median(by_rank.values())
                row[f"{key}_max_rank"] = max(by_rank, key=lambda r: (by_rank[r], -r))
        if self._count("idle") == self.world:
            cpu = [e["cpu_per_s"] * 100 for e in ev["idle"].values()]
            row["idle_cpu_pct"] = statistics.mean(cpu)
            row["idle_cpu_pct_max"] = max(cpu)
        if self._count("done") == self.world:
            row["torch_loaded"] = any(e["torch_loaded"] for e in ev["done"].values())
        self._cases(row)
        return row

    def _cases(self, row: dict[str, Any]) -> None:
        """The latency cases of `row`: correct, rounds (slowest rank's us per call), median."""
        by_rank = [self.cases.get(r, []) for r in range(self.world)]
        row["cases"] = {}
        for name, *_ in CASES:
            got = [c for cs in by_rank for c in cs if c["case"] == name]
            if len(got) < self.world:
                continue
            case: dict[str, Any] = {"correct": all(c["correct"] for c in got)}
            if case["correct"]:
                rounds = [max(c["per_call_s"][i] for c in got) * 1e6
                          for i in range(len(got[0]["per_call_s"]))]
                case.update(us=statistics.median(rounds), rounds_us=rounds)
                row[f"{name}_us"] = case["us"]
            row["cases"][name] = case
        wrong = [n for n, c in row["cases"].items() if not c["correct"]]
        if row.get("first_correct") is False:
            wrong.insert(0, "first all_reduce")
        if wrong and self.status == "ok":
            row["status"] = "wrong result"
            row["error"] = [f"wrong result on some rank: {', '.join(wrong)} (not timed)"]


def run_one(args: argparse.Namespace, side: dict[str, Any], world: int,
            progress: Progress) -> dict[str, Any]:
    """One side's world, or its row saying why it did not run."""
    need = RANK_MB["rustdist" if side["side"] == "rustdist" else "gloo"] * world
    avail = mem_available_mb()
    if avail is not None and need > 0.9 * avail:
        return {"world": world, "side": side["side"], "label": side["label"],
                "shm": side["shm"], "status": "skipped",
                "error": [f"needs about {need:.0f} MB, {avail:.0f} MB available"]}
    t0, load, core = time.monotonic(), os.getloadavg()[0], core_built()
    starts = []
    for n in range(args.scale_starts):
        w = World(args, side, world, progress, init_only=n < args.scale_starts - 1)
        w.run()
        starts.append(w.row())
        if w.status != "ok":  # a world that failed once is not started again
            break
    row = starts[-1]
    if row["status"] == "ok" and len(starts) > 1:
        # init and the first collective: the median over the starts (each the slowest rank)
        for key in ("init_s", "first_collective_s"):
            row[f"{key}_starts"] = [s[key] for s in starts]
            row[key] = statistics.median(row[f"{key}_starts"])
    # The host's 1-minute load before and after: other work running beside the ranks.
    row.update(wall_s=time.monotonic() - t0, loadavg_before=load,
               loadavg_after=os.getloadavg()[0], core_built=core)
    if core_built() != core:
        row["error"] = (row.get("error") or []) + [
            "rustdist's extension was replaced while this world ran"]
    return row


def core_built() -> Optional[str]:
    """When the rustdist extension the ranks load was written (a wheel reinstalled between
    two worlds shows here), ISO time; None where unknown."""
    spec = importlib.util.find_spec("rustdist._core")
    if spec is None or not spec.origin:
        return None
    try:
        mtime = os.path.getmtime(spec.origin)
    except OSError:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(mtime))


def _num(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def _pair(row: dict[str, Any], key: str, second: str, fmt: str) -> str:
    if row.get(key) is None:
        return "—"
    return f"{row[key]:{fmt}} ({row[second]:{fmt}})"


TABLE_HEADER = ("| world | side | status | init s | 1st collective s | threads max (median) | "
                "fds max (median) | RSS MB max (median) | idle CPU % mean (max) | "
                "8 B all_reduce us | barrier us | 1 MiB all_reduce us |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|")


def table_row(row: dict[str, Any]) -> str:
    """`row` as a line of :data:`TABLE_HEADER`'s table, its error lines under it."""
    line = (f"| {row['world']} | {row['label']} | {row['status']} | "
            f"{_num(row.get('init_s'), '.3f')} | {_num(row.get('first_collective_s'), '.3f')} | "
            f"{_pair(row, 'threads', 'threads_median', '.0f')} | "
            f"{_pair(row, 'fds', 'fds_median', '.0f')} | "
            f"{_pair(row, 'rss_mb', 'rss_mb_median', '.0f')} | "
            f"{_pair(row, 'idle_cpu_pct', 'idle_cpu_pct_max', '.2f')} | "
            + " | ".join(_num(row.get(f"{name}_us"), ".0f") for name, *_ in CASES) + " |")
    return "\n".join([line] + [f"    {e}" for e in row.get("error") or []])


def write_plots(rows: list[dict[str, Any]], json_path: str, title: str) -> list[str]:
    """A PNG per figure of :data:`FIGURES` against the world size (log2), a line per side
    (dashed: the median, or for idle CPU the max, over the ranks); returns the paths."""
    from matplotlib.figure import Figure

    second = {"threads": "threads_median", "fds": "fds_median", "rss_mb": "rss_mb_median",
              "idle_cpu_pct": "idle_cpu_pct_max"}
    worlds = sorted({r["world"] for r in rows})
    paths = []
    for key, label, log in FIGURES:
        if not any(r.get(key) is not None for r in rows):
            continue
        fig = Figure(figsize=(6.5, 4.5), layout="constrained")
        ax = fig.subplots()
        for name in dict.fromkeys(r["label"] for r in rows):
            mine = [r for r in rows if r["label"] == name and r.get(key) is not None]
            if not mine:
                continue
            line, = ax.plot([r["world"] for r in mine], [r[key] for r in mine], marker="o",
                            label=name)
            if key in second:
                ax.plot([r["world"] for r in mine], [r[second[key]] for r in mine],
                        linestyle="--", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds, [str(w) for w in worlds])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        note = {"threads": "solid: max, dashed: median over ranks",
                "fds": "solid: max, dashed: median over ranks",
                "rss_mb": "solid: max, dashed: median over ranks",
                "idle_cpu_pct": "solid: mean, dashed: max over ranks"}.get(key, "slowest rank")
        fig.suptitle(f"--scale: {label}\n{title}; {note}", fontsize=9)
        path = plot.plot_path(json_path, key.removesuffix("_us").removesuffix("_s"))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def build() -> dict[str, Any]:
    """The source tree's commit (``git rev-parse --short HEAD``) and whether tracked files
    differ from it; None where there is no git."""
    def git(*argv: str) -> Optional[str]:
        try:
            return subprocess.run(["git", *argv], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "tracked_changes": None if changed is None else bool(changed)}


def scale_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """Every side at every world size: prints the table, writes the JSON and the plots; 1
    when a world did not start, failed or computed a wrong result."""
    if args.model:
        return scale_model.model_run(args.model, args.model_latency_us, args.model_bandwidth)
    mach = {**mach, **build()}
    # Stopped with SIGTERM, the bench unwinds: every world's ranks are stopped, its run folder
    # and test hosts removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    where = (f"test hosts of {args.scale_hosts or 1} ranks, links {args.link}" if args.link
             else f"hosts of {args.scale_hosts} ranks (RUSTDIST_HOST_ID)" if args.scale_hosts
             else "one host")
    print(f"--scale | {mach['cpu']} | {mach['usable_cores']}/{mach['cores']} cores | "
          f"rustdist {mach['rustdist']} at {mach['commit']} | torch {mach['torch']} | {where}")
    print(f"init and 1st collective: slowest rank from the common start; idle CPU over "
          f"{args.scale_idle:g} s; latency: median of {args.scale_rounds} rounds of the slowest "
          "rank's mean per call", flush=True)
    plan = [(w, s) for w in args.world for s in sides_of(args, w)]
    progress = Progress(len(plan))
    progress.print(TABLE_HEADER)
    rows = []
    started = time.time()
    for world, side in plan:
        row = run_one(args, side, world, progress)
        rows.append(row)
        progress.print(table_row(row))
        progress.advance()
    progress.close()
    paths: list[str] = []
    if plot.available():
        paths = write_plots(rows, args.json, f"{mach['cpu']}, {mach['usable_cores']} cores, "
                                             f"rustdist at {mach['commit']}")
        print(f"plots written: {', '.join(paths) or 'none (no figures)'}")
    else:
        print(f"plots skipped: {plot.MISSING}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"machine": mach, "mode": "scale",
                   "date": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
                   "command": (" ".join(["python -m rustdist.bench", *sys.argv[1:]])
                               if "--scale" in sys.argv else None),
                   "config": {"worlds": args.world, "sides": args.scale_sides,
                              "shm": args.shm, "gloo_max_world": args.gloo_max_world,
                              "hosts_of": args.scale_hosts, "link": args.link,
                              "delay_ms": args.delay, "idle_s": args.scale_idle,
                              "rounds": args.scale_rounds, "starts": args.scale_starts,
                              "timeout_s": args.scale_timeout,
                              "cases": [{"name": n, "op": op, "float32": e,
                                         "calls_at_world_8": c} for n, op, e, c in CASES]},
                   "results": rows, "plots": paths}, f, indent=1)
    print(f"results written to {args.json}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1
