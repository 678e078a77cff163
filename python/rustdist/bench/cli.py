"""``python -m rustdist.bench``: options, the runs of each mode, printing and the JSON file."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from . import __doc__ as PACKAGE_DOC
from . import plot, reconfig_rank, recovery, report, scale, soak, train, window
from .common import (
    DEEPSPEED_SIZES, DTYPE_BYTES, LABELS, OPS, SIZES, Config, fmt_size, machine, parse_size,
    round_plan, write_json,
)
from .launch import Launcher, free_port, mpi_problem, mpi_version, run_world, start_ranks
from .progress import Progress
from .selection import format_selection, selection_table

MASTER_ADDR = "127.0.0.1"
DEFAULT_WORLDS = {"compare": [2, 4], "deepspeed": [2, 4], "cuda": [1], "soak": [4],
                  "recovery": [2, 3, 4], "train": [2, 4], "scale": [8, 16, 32, 64],
                  "window": window.DEFAULT_WORLDS}
#: --recovery through reconfigure: gloo's side runs where its torch processes fit.
RECONFIGURE_WORLDS = [3, 8, 32]
SOAK_OPS = 100_000
MAX_ITERS = 2000


def _world_size(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("world sizes start at 1")
    return n


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The options, with ``mode`` ("compare", "deepspeed", "cuda", "soak", ...), ``world``,
    ``ops``, ``dtypes`` and ``sizes`` resolved."""
    p = argparse.ArgumentParser(prog="python -m rustdist.bench",
                                description=(PACKAGE_DOC or "").splitlines()[0])
    p.add_argument("--world", type=_world_size, nargs="+",
                   help="world sizes (default: 2 4; 1 with --device cuda; 4 with --soak)")
    p.add_argument("--ops", nargs="+", choices=OPS,
                   help="collectives to run (default: all; all_reduce with --vs deepspeed)")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPE_BYTES),
                   help="with --vs deepspeed: element types (default: all three); the other "
                        "modes run float32")
    p.add_argument("--max-bytes", type=parse_size,
                   help="largest size, e.g. 2M (default: 64MiB; 16MiB with --vs deepspeed)")
    p.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    p.add_argument("--json", default="bench-results.json",
                   help="where to write the results (default: bench-results.json); the plots "
                        "go next to it (bench-results-<op>.png)")
    p.add_argument("--vs", choices=["mpi", "deepspeed"],
                   help="mpi: also compare with Open MPI (mpi4py; the ranks run under mpirun); "
                        "deepspeed: all_reduce against DeepSpeed's shared-memory "
                        "inference_all_reduce, rustdist through the torch door and the import "
                        "swap, and gloo (vs_deepspeed.py)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: rustdist's NCCL path vs torch's ProcessGroupNCCL, a GPU per rank")
    p.add_argument("--soak", action="store_true",
                   help="mixed operations through rustdist only, watching RSS, fds and threads")
    p.add_argument("--soak-ops", type=int, default=SOAK_OPS,
                   help=f"operations of --soak (default: {SOAK_OPS})")
    p.add_argument("--recovery", action="store_true",
                   help="how long the survivors of a rank that died take to work again: "
                        "through reconfigure, alone and with a spare joining, beside gloo "
                        "(worlds 3 8 32); or through shrink_group (--recovery-api), on shared "
                        "memory and on TCP (with --link: between test hosts)")
    p.add_argument("--recovery-api", choices=["reconfigure", "shrink_group"],
                   default="reconfigure", help="what --recovery times (default: reconfigure)")
    p.add_argument("--recovery-rounds", type=int, default=5,
                   help="worlds started per world size and links with --recovery (default: 5)")
    p.add_argument("--link", metavar="RATE",
                   help="run each rank on a test host of its own (a network namespace; root "
                        "and iproute2), every host's link shaped to RATE with tc, e.g. 1gbit, "
                        "10gbit: the TCP path between hosts")
    p.add_argument("--delay", metavar="MS", type=float, default=0.0,
                   help="with --link: every host's sends also arrive MS milliseconds later "
                        "(netem, or a delay line in user space where the kernel has none)")
    p.add_argument("--bind", action=argparse.BooleanOptionalAction,
                   help="where a world has more ranks than the host has cores, run rank r on "
                        "core r mod cores, the same for every peer (they share the rank "
                        "processes); default: with --vs mpi or --vs deepspeed only")
    p.add_argument("--show-selection", action="store_true",
                   help="print which algorithm rustdist picks per collective, link kind, world "
                        "and size, and run nothing")
    train.add_arguments(p)
    scale.add_arguments(p)
    window.add_arguments(p)
    args = p.parse_args(argv)
    if args.scale and (args.train or args.soak or args.recovery or args.vs
                       or args.device == "cuda"):
        p.error("--scale runs its own sides on the CPU: not with --train, --soak, --recovery, "
                "--vs or --device cuda")
    if args.scale:
        scale.check_args(p, args)
    if args.train and (args.soak or args.recovery or args.vs or args.device == "cuda"
                       or args.link):
        p.error("--train runs its own sides on the CPU of one host: not with --soak, "
                "--recovery, --vs, --device cuda or --link")
    if (args.soak or args.recovery) and (args.vs or args.device == "cuda"):
        p.error("--soak and --recovery run rustdist alone on the CPU: no --vs or --device cuda")
    if args.soak and args.recovery:
        p.error("--soak or --recovery, not both")
    if args.recovery_rounds < 1:
        p.error("--recovery-rounds must be positive")
    if args.link and (args.vs or args.device == "cuda"):
        p.error("--link runs rustdist and gloo on CPU test hosts: no --vs or --device cuda")
    if args.delay < 0 or (args.delay and not args.link):
        p.error("--delay is a non-negative number of milliseconds, given with --link")
    if args.vs and args.device == "cuda":
        p.error("--vs compares CPU collectives; not with --device cuda")
    if args.bind is None:
        args.bind = bool(args.vs)
    if args.window and (args.scale or args.train or args.soak or args.recovery or args.vs
                        or args.device == "cuda" or args.link):
        p.error("--window runs its own sides (rustdist and Open MPI) and links: not with "
                "--scale, --train, --soak, --recovery, --vs, --device cuda or --link")
    args.mode = ("window" if args.window else "scale" if args.scale else "train" if args.train
                 else "soak" if args.soak
                 else "recovery" if args.recovery
                 else "cuda" if args.device == "cuda"
                 else "deepspeed" if args.vs == "deepspeed" else "compare")
    if args.mode == "deepspeed":
        if args.ops not in (None, ["all_reduce"]):
            p.error("--vs deepspeed times all_reduce alone (DeepSpeed's op is all_reduce SUM)")
        args.ops, args.dtypes = ["all_reduce"], args.dtypes or list(DTYPE_BYTES)
    elif args.dtypes not in (None, ["float32"]):
        p.error("--dtypes other than float32 need --vs deepspeed")
    else:
        args.ops, args.dtypes = args.ops or list(OPS), ["float32"]
    # The dtypes DeepSpeed's op runs here: vs_deepspeed.run finds them out.
    args.deepspeed_dtypes = []
    if args.recovery and args.recovery_api == "reconfigure" and args.link:
        p.error("--recovery through reconfigure runs on one host: --link goes with "
                "--recovery-api shrink_group")
    args.world = args.world or (RECONFIGURE_WORLDS if args.mode == "recovery"
                                and args.recovery_api == "reconfigure"
                                else DEFAULT_WORLDS[args.mode])
    if args.mode != "cuda" and not args.show_selection and min(args.world) < 2:
        p.error("world sizes start at 2 (1 only with --device cuda)")
    if args.soak_ops < 1:
        p.error("--soak-ops must be positive")
    ladder = DEEPSPEED_SIZES if args.mode == "deepspeed" else SIZES
    args.sizes = tuple(s for s in ladder if args.max_bytes is None or s <= args.max_bytes)
    if not args.sizes:
        p.error(f"--max-bytes must be at least {ladder[0]}")
    return args


def _config(args: argparse.Namespace, world: int, master_addr: str = MASTER_ADDR) -> Config:
    """The config of one world, on a port free now (taken when the world starts)."""
    rounds, round_seconds = round_plan(args.quick)
    port = free_port(MASTER_ADDR) if master_addr == MASTER_ADDR else 29500
    return Config(mode=args.mode, world=world, ops=tuple(args.ops), sizes=args.sizes,
                  rounds=rounds, round_seconds=round_seconds, max_iters=MAX_ITERS,
                  mpi=args.vs == "mpi", master_addr=master_addr,
                  master_port=port, soak_ops=args.soak_ops, bind=args.bind,
                  dtypes=tuple(args.dtypes), deepspeed=tuple(args.deepspeed_dtypes))


@contextlib.contextmanager
def _world_hosts(args: argparse.Namespace, world: int) -> Iterator[tuple[str, Launcher]]:
    """Where one world runs: (MASTER_ADDR, launcher). With ``--link``, a test host per rank
    (fresh namespaces, so the port is free) with its link shaped, torn down afterwards."""
    if not args.link:
        yield MASTER_ADDR, start_ranks
        return
    from .. import _netns

    with _netns.Hosts(world) as hosts:
        hosts.shape(rate=args.link, delay_ms=args.delay)

        def launch(commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]]
                   ) -> list[subprocess.Popen[Any]]:
            # gloo and rustdist both listen on the host's eth0 (gloo would take the address
            # the hostname resolves to: loopback); rustdist measures the rate at connect.
            return [hosts.popen(r, list(cmd), stdin=subprocess.DEVNULL,
                                env={**env, "GLOO_SOCKET_IFNAME": "eth0"})
                    for r, (cmd, env) in enumerate(zip(commands, envs))]

        yield hosts.addr(0), launch


def _link_words(args: argparse.Namespace) -> str:
    """How the links were shaped, in words."""
    if not args.delay:
        return f"{args.link} (tc tbf)"
    from .. import _netns

    how = "netem" if _netns.netem_available() else "a delay line in user space"
    return f"{args.link} (tc tbf) and {args.delay:g} ms one way ({how})"


def _run(args: argparse.Namespace, world: int, on_event: Callable[[dict[str, Any]], None],
         progress: Progress) -> None:
    """One world; a failed rank ends the bench (its traceback is already on stderr)."""
    try:
        with _world_hosts(args, world) as (master_addr, launcher):
            run_world(_config(args, world, master_addr), on_event, launcher=launcher,
                      on_poll=progress.tick)
    except RuntimeError as e:
        progress.close()
        sys.exit(f"bench failed: {e}")


def compare(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """rustdist vs gloo (and MPI), or vs torch's NCCL on CUDA: prints the tables, writes the
    JSON and the plots; 1 when a result was wrong."""
    cuda = args.mode == "cuda"
    peers = ["rustdist", "torch_nccl"] if cuda else ["rustdist", "gloo"] + (
        ["mpi"] if args.vs == "mpi" else [])
    rounds, round_s = round_plan(args.quick)
    print(f"{' vs '.join(LABELS[p] for p in peers)} | {mach['cpu']} | "
          f"{mach['usable_cores']}/{mach['cores']} cores | Python {mach['python']} | "
          f"torch {mach['torch']} | rustdist {mach['rustdist']} ({mach['rustdist_links']})"
          + (f" | {mach['mpi']}" if "mpi" in mach else "")
          + (f" | a test host per rank, links shaped to {_link_words(args)}" if args.link else ""))
    print(f"{rounds} alternating rounds of ~{round_s * 1e3:.0f} ms per side (barrier, then N "
          "calls, same N for every side); latency = median over rounds of the slowest rank's "
          "mean per call")
    print("size and busbw (GB/s) as in nccl-tests; speed-up = their us / rustdist us")
    per_world = len(args.ops) * len(args.sizes) + (0 if cuda else 1)
    progress = Progress(per_world * len(args.world))
    rows: list[dict[str, Any]] = []
    fronts: list[dict[str, Any]] = []
    start = time.perf_counter()
    for world in args.world:
        def on_event(ev: dict[str, Any], world: int = world) -> None:
            kind = ev.pop("event")
            ev.pop("rank")
            if kind == "case":
                progress.update(label=f"world {world} {ev['op']} {fmt_size(ev['bytes'])}")
            elif kind == "row":
                if not rows or (rows[-1]["op"], rows[-1]["world"]) != (ev["op"], world):
                    progress.print(f"\nworld {world} · {ev['op']} (float32)\n"
                                   f"{report.header(peers)}")
                rows.append(ev)
                progress.print(report.fmt_row(ev, peers))
                progress.advance()
            elif kind == "front_door":
                fronts.append(ev)
                progress.print("\n" + report.front_door_line(ev))
                progress.advance()

        _run(args, world, on_event, progress)
    progress.close()
    summary = report.summarize(rows, fronts, peers, time.perf_counter() - start)
    print("\nsummary: " + "\n         ".join(report.summary_lines(summary)))
    plots = plot.write_run_plots(rows, args.json, mach)
    write_json(args.json, {
        "machine": mach, "mode": args.mode, "peers": peers,
        "launcher": ("mpirun --allow-run-as-root --oversubscribe" if args.vs else
                     f"a test host per rank, links shaped to {_link_words(args)}" if args.link
                     else "processes"),
        "link": args.link, "delay_ms": args.delay,
        "binding": ("rank r on core r mod cores where a world has more ranks than cores"
                    if args.bind else "none"),
        "config": {"worlds": args.world, "ops": args.ops, "sizes": list(args.sizes),
                   "rounds": rounds, "round_seconds": round_s, "max_iters": MAX_ITERS},
        "results": rows, "front_door": fronts, "summary": summary, "plots": plots})
    return 1 if summary["wrong"] else 0


def soak_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """The soak at every world size: prints the samples, writes the JSON; 1 on a failure."""
    print(f"soak: {args.soak_ops} mixed operations through rustdist {mach['rustdist']} "
          f"({mach['rustdist_links']}), sampled every {soak.SAMPLE_EVERY} after a warm-up of "
          f"{soak.WARMUP_OPS}; pass: last sample within {soak.RSS_TOLERANCE:.0%} RSS, equal fds "
          "and threads, of the first")
    samples_per_world = -(-args.soak_ops // soak.SAMPLE_EVERY) + 1
    progress = Progress(samples_per_world * len(args.world))
    results: dict[int, Any] = {}
    failed = False
    for world in args.world:
        samples: list[dict[str, Any]] = []
        by_ops: dict[int, dict[int, dict[str, Any]]] = {}
        progress.print(f"\nworld {world}\n{soak.table_header(world)}")

        def on_event(ev: dict[str, Any], world: int = world) -> None:
            ev.pop("event")
            samples.append(ev)
            row = by_ops.setdefault(ev["ops"], {})
            row[ev["rank"]] = ev
            if ev["rank"] == 0:
                progress.advance(label=f"world {world}: {ev['ops']} ops")
            if len(row) == world:
                progress.print(soak.table_row(ev["ops"], row))

        _run(args, world, on_event, progress)
        problems = soak.verdict(samples)
        failed = failed or bool(problems)
        results[world] = {"passed": not problems, "problems": problems, "samples": samples}
        progress.print("\n".join(problems) if problems else f"world {world}: passed")
    progress.close()
    write_json(args.json, {"machine": mach, "mode": "soak",
                           "config": {"worlds": args.world, "ops": args.soak_ops,
                                      "sample_every": soak.SAMPLE_EVERY,
                                      "warmup_ops": soak.WARMUP_OPS},
                           "soak": results})
    return 1 if failed else 0


def reconfigure_recovery_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """The reconfigure rounds of rustdist and gloo at every world size, both scenarios:
    prints the table, writes the JSON; 1 when rustdist recovered later than gloo anywhere."""
    print(f"recovery through reconfigure, rustdist (numpy processes) beside gloo (torch "
          f"{mach['torch']}) | rustdist {mach['rustdist']} | {mach['cpu']} | "
          f"{mach['usable_cores']}/{mach['cores']} cores | {args.recovery_rounds} rounds per "
          "cell; ms from a rank's death, slowest member, median (min-max)")
    cells = [(sc, w) for sc in recovery.SCENARIOS for w in args.world]
    progress = Progress(2 * len(cells) * args.recovery_rounds)
    progress.print(recovery.RECONFIGURE_HEADER)
    results, behind = [], []
    for scenario, world in cells:
        sides: dict[str, Any] = {}
        for side in ("rustdist", "gloo"):
            if side == "gloo" and not recovery.gloo_fits(world):
                progress.update(progress.done + args.recovery_rounds,
                                f"gloo world {world}: no room")
                continue
            rounds = []
            for _ in range(args.recovery_rounds):
                try:
                    rounds.append(recovery.reconfigure_round(side, world, scenario))
                except RuntimeError as e:
                    progress.close()
                    sys.exit(f"bench failed: {e}")
                progress.advance(label=f"{side}, {scenario}, world {world}")
            sides[side] = {"rounds": rounds, **recovery.reconfigure_summary(rounds)}
        progress.print(recovery.reconfigure_row(scenario, world, sides["rustdist"],
                                                sides.get("gloo")))
        if "gloo" in sides and (sides["rustdist"]["recovered"]["median"]
                                > sides["gloo"]["recovered"]["median"]):
            behind.append(f"{scenario} world {world}")
        results.append({"scenario": scenario, "world": world, **sides})
    progress.close()
    write_json(args.json, {"machine": mach, "mode": "recovery", "api": "reconfigure",
                           "config": {"worlds": args.world, "rounds": args.recovery_rounds,
                                      "blocked_elements": reconfig_rank.BLOCKED_ELEMENTS},
                           "recovery": results})
    if behind:
        print(f"rustdist recovered later than gloo (median): {', '.join(behind)}")
    return 1 if behind else 0


def recovery_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """The recovery rounds at every world size, on shared memory and on TCP (with --link: on
    test hosts): prints the table, writes the JSON."""
    if args.recovery_api == "reconfigure":
        return reconfigure_recovery_run(args, mach)
    links = ([f"test hosts, {_link_words(args)}"] if args.link
             else ["shared memory", "TCP (RUSTDIST_SHM=0)"])
    print(f"recovery through shrink_group | rustdist {mach['rustdist']} | {mach['cpu']} | "
          f"{mach['usable_cores']}/{mach['cores']} cores | {args.recovery_rounds} rounds per cell;"
          " ms from a rank's death, slowest survivor, median (min-max)")
    progress = Progress(len(links) * len(args.world) * args.recovery_rounds)
    progress.print(recovery.TABLE_HEADER)
    results = []
    saved = os.environ.get("RUSTDIST_SHM")
    try:
        for link in links:
            if not args.link:  # the ranks inherit it
                os.environ["RUSTDIST_SHM"] = "0" if link.startswith("TCP") else "1"
            for world in args.world:
                rounds = []
                for _ in range(args.recovery_rounds):
                    events: list[dict[str, Any]] = []
                    _run(args, world, events.append, progress)
                    rounds.append(recovery.round_result(events))
                    progress.advance(label=f"{link}, world {world}")
                summary = recovery.summarize(rounds)
                progress.print(recovery.table_row(link, world, summary))
                results.append({"links": link, "world": world, "rounds": rounds, **summary})
    finally:
        if saved is None:
            os.environ.pop("RUSTDIST_SHM", None)
        else:
            os.environ["RUSTDIST_SHM"] = saved
    progress.close()
    write_json(args.json, {"machine": mach, "mode": "recovery",
                           "config": {"worlds": args.world, "rounds": args.recovery_rounds,
                                      "blocked_bytes": recovery.BLOCKED_BYTES},
                           "recovery": results})
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Runs what the options ask for; the exit status (0: done and right)."""
    args = parse_args(argv)
    if args.show_selection:
        try:
            print(format_selection(selection_table(args.world, args.sizes)))
        except RuntimeError as e:
            sys.exit(f"--show-selection: {e}")
        return 0
    problem = (mpi_problem() if args.vs == "mpi" or args.mode == "window" else None) or (
        _cuda_problem(args.world) if args.mode == "cuda" else None)
    if problem:
        sys.exit(problem)
    mach = machine()
    if args.vs == "mpi" or args.mode == "window":
        mach["mpi"] = mpi_version()
    if args.mode == "deepspeed":
        # Imported here, not at the top: `python -m` runs it (the docs' table) and the
        # module it imports (the op's build), which the package must not import first.
        from .vs_deepspeed import run as deepspeed_run

        return deepspeed_run(args, mach, _run)
    runs = {"soak": soak_run, "recovery": recovery_run, "train": train.train_run,
            "scale": scale.scale_run, "window": window.window_run}
    return runs.get(args.mode, compare)(args, mach)


def _cuda_problem(worlds: list[int]) -> Optional[str]:
    from .gpu import cuda_problem

    return cuda_problem(max(worlds))
