"""``python -m rustdist.bench --window``: one-sided puts through a rustdist window beside Open
MPI's RMA (``MPI.Win.Allocate``, ``Put``, ``Flush``, passive target), and a put+signal round
trip beside rustdist's matched send/recv, in the same processes (one ``mpirun`` job per world and
link; ``window_rank.py`` is the rank). Three links: shared memory (UNIFIED access; Open MPI's osc
sm), TCP over loopback (``RUSTDIST_SHM=0``) and TCP between test hosts (one rank per host,
network namespaces joined by veth; needs root), both SEPARATE access with puts carried on the
links, and Open MPI on ``btl tcp`` with osc pt2pt, its TCP one-sided path. On SEPARATE windows
both sides' put times include remote completion (see ``window_rank.py``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator

from . import plot
from .common import fmt_size, write_json
from .launch import free_port

DEFAULT_WORLDS = [2, 4]
#: Each link: the ranks' environment and Open MPI's transport options. On TCP, Open MPI's
#: one-sided path is osc pt2pt over btl tcp, which refuses MPI_THREAD_MULTIPLE (mpi4py's
#: default); only the main thread calls MPI, so serialized suffices. Between test hosts every
#: rank has a host's one slot, so Open MPI would spin without yielding, though the hosts share
#: this machine's cores: the kernel's packet delivery then waits for a timeslice, and even a
#: plain Send/Recv round trip took 8 ms. ``mpi_yield_when_idle 1``, what Open MPI sets itself
#: when it knows ranks share cores, brings it to 27-39 us.
LINKS: dict[str, tuple[dict[str, str], list[str]]] = {
    "shm": ({}, []),
    "tcp": ({"RUSTDIST_SHM": "0", "MPI4PY_RC_THREAD_LEVEL": "serialized"},
            ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo",
             "--mca", "osc", "pt2pt"]),
    "hosts": ({"MPI4PY_RC_THREAD_LEVEL": "serialized"},
              ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0",
               "--mca", "oob_tcp_if_include", "eth0", "--mca", "osc", "pt2pt",
               "--mca", "mpi_yield_when_idle", "1"]),
}
#: Open MPI starts its daemon on each test host through this rsh agent: the host is named by
#: its address, and the command runs inside the host's namespaces (``Hosts.command``).
RSH_AGENT = """#!{python}
import os, sys
on_host = {table!r}
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[1:]
argv = on_host[args[0]] + ["sh", "-c", " ".join(args[1:])]
os.execvp(argv[0], argv)
"""
RUN_TIMEOUT_S = 900
LINE_STYLES = {"shm": "-", "tcp": "--", "hosts": ":"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", action="store_true",
                   help="one-sided windows: rustdist's put beside Open MPI's MPI_Put (latency "
                        "8 B - 64 KiB, bandwidth 64 KiB - 64 MiB) and put+signal beside "
                        "send/recv (worlds 2 4: shared memory and TCP over loopback on "
                        "this host, and TCP between test hosts where root can make them; "
                        "needs mpirun and mpi4py)")


Runner = Callable[..., "subprocess.CompletedProcess[Any]"]


@contextlib.contextmanager
def _placement(link: str, world: int, tmp: str) -> Iterator[tuple[str, list[str], Runner]]:
    """Where `world` ranks run: (MASTER_ADDR, mpirun's placement options, how mpirun is run).
    On "hosts", a test host per rank, with mpirun on host 0; else all on this host."""
    if link != "hosts":
        yield "127.0.0.1", [], subprocess.run
        return
    from .. import _netns

    with _netns.Hosts(world) as hosts:
        agent = os.path.join(tmp, "rsh-agent")
        table = {hosts.addr(i): hosts.command(i, []) for i in range(world)}
        with open(agent, "w", encoding="utf-8") as f:
            f.write(RSH_AGENT.format(python=sys.executable, table=table))
        os.chmod(agent, 0o755)
        where = ["--host", ",".join(f"{addr}:1" for addr in table),
                 "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1"]
        yield hosts.addr(0), where, lambda cmd, **kw: hosts.run(0, cmd, **kw)


def _world(world: int, link: str, quick: bool) -> dict[str, Any]:
    """One mpirun job of `world` ranks on `link`; the results rank 0 wrote."""
    ours, theirs = LINKS[link]
    with tempfile.TemporaryDirectory(prefix="rustdist-window-") as tmp, \
            _placement(link, world, tmp) as (master_addr, where, run):
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, MASTER_ADDR=master_addr, MASTER_PORT=str(free_port()),
                   OMP_NUM_THREADS="1", **ours)
        cmd = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe",
               "-np", str(world), *where, "-x", "MASTER_ADDR", "-x", "MASTER_PORT", *theirs,
               *(x for name in ours for x in ("-x", name)),
               "-x", "OMP_NUM_THREADS", *(["-x", "PYTHONPATH"] if "PYTHONPATH" in env else []),
               sys.executable, "-m", "rustdist.bench.window_rank", out,
               *(["--quick"] if quick else [])]
        done = run(cmd, env=env, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"world {world} on {link}: mpirun exited with {done.returncode}")
        with open(out, encoding="utf-8") as f:
            return dict(json.load(f), link=link)


def rows(result: dict[str, Any]) -> list[str]:
    """The printed table of one world."""
    w = f"world {result['world']}, {result.get('link', 'shm')}"
    lines = [f"{w}: put latency (us, origin side, put + completion)",
             f"  {'size':>8} {'rustdist':>10} {'Open MPI':>10} {'MPI/ours':>9}"]
    for r in result["latency"]:
        lines.append(f"  {fmt_size(r['bytes']):>8} {r['rustdist_us']:>10.2f} "
                     f"{r['mpi_us']:>10.2f} {r['mpi_us'] / r['rustdist_us']:>8.2f}x")
    lines += [f"{w}: put bandwidth (GB/s, puts back to back, then completion)",
              f"  {'size':>8} {'rustdist':>10} {'Open MPI':>10} {'ours/MPI':>9}"]
    for r in result["bandwidth"]:
        lines.append(f"  {fmt_size(r['bytes']):>8} {r['rustdist_gbps']:>10.2f} "
                     f"{r['mpi_gbps']:>10.2f} {r['rustdist_gbps'] / r['mpi_gbps']:>8.2f}x")
    lines += [f"{w}: round trip (us): put+signal, answered the same way, beside a "
              "matched send/recv ping-pong",
              f"  {'size':>8} {'put+signal':>10} {'send/recv':>10} {'s-r/ours':>9}"]
    for r in result["round_trip"]:
        lines.append(f"  {fmt_size(r['bytes']):>8} {r['put_signal_us']:>10.2f} "
                     f"{r['send_recv_us']:>10.2f} "
                     f"{r['send_recv_us'] / r['put_signal_us']:>8.2f}x")
    return lines


def window_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """Every world of ``--world`` (default 2 4), printed and written to ``--json``."""
    print(f"one-sided windows | rustdist {mach['rustdist']} | {mach.get('mpi', 'Open MPI')} | "
          f"{mach['cpu']} | {mach['usable_cores']}/{mach['cores']} cores")
    results = []
    links = list(LINKS)
    from .. import _netns

    problem = _netns.unavailable_reason()  # test hosts need root and ip netns
    if problem:
        links.remove("hosts")
        print(f"TCP between test hosts skipped: {problem}")
    for link in links:
        for world in args.world:
            result = _world(world, link, args.quick)
            results.append(result)
            print("\n".join(rows(result)), flush=True)
    write_json(args.json, {"machine": mach, "mode": "window", "quick": args.quick,
                           "window": results})
    if plot.available():
        print(f"plot: {write_plot(results, args.json, mach['cpu'])}")
    return 0


def write_plot(results: list[dict[str, Any]], json_path: str, title: str) -> str:
    """One PNG beside the JSON (``<stem>-window.png``): put latency, put bandwidth and the
    round trips against size, a line per library (and world)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), layout="constrained")
    panels = fig.subplots(1, 3)
    series = [("latency", "put latency (us)", [("rustdist_us", "rustdist put"),
                                                ("mpi_us", "Open MPI Put+Flush")]),
              ("bandwidth", "put bandwidth (GB/s)", [("rustdist_gbps", "rustdist put"),
                                                     ("mpi_gbps", "Open MPI Put, Flush")]),
              ("round_trip", "round trip (us)", [("put_signal_us", "rustdist put+signal"),
                                                 ("send_recv_us", "rustdist send/recv")])]
    for ax, (kind, label, lines) in zip(panels, series):
        for result in results:
            rows = result[kind]
            sizes = [r["bytes"] for r in rows]
            for key, name in lines:
                ax.plot(sizes, [r[key] for r in rows], marker="o",
                        linestyle=LINE_STYLES[result.get("link", "shm")],
                        label=f"{name}, world {result['world']}, {result.get('link', 'shm')}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [fmt_size(s) for s in sizes], rotation=45)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("one-sided windows: shared memory (solid), TCP over loopback (dashed), TCP "
                 f"between test hosts (dotted): rustdist vs Open MPI RMA\n{title}")
    path = plot.plot_path(json_path, "window")
    fig.savefig(path, dpi=110)
    return path
