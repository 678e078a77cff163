"""``--vs deepspeed``: rustdist's all_reduce against DeepSpeed's shared-memory all_reduce.

DeepSpeed's ``deepspeed.comm.inference_all_reduce`` (SUM only) is what its tensor-parallel
inference on CPUs calls, typically in bf16. The run times all_reduce in float32,
bfloat16 and float16 (``--dtypes``) at worlds 2 and 4, 8 B to 16 MiB, on four sides in the
same rank processes and on the same buffers: DeepSpeed's op (``deepspeed_shm.py``, built at
first use), rustdist through the torch door (``torch.distributed.all_reduce`` on torch's
default group, whose backend is rustdist), rustdist through the import swap
(``import rustdist as dist``) and gloo (a ``new_group(backend="gloo")`` of the same ranks).
Rounds, checks and the slowest-rank medians are the default mode's (rank.py). As with
``--vs mpi``, a world with more ranks than cores is bound, rank r on core r mod cores.
Where DeepSpeed cannot run (not installed, its op does not build, a dtype its CPU lacks the
instructions for) the run says why and times the other sides.
``python -m rustdist.bench.vs_deepspeed RESULTS.json [WORLD]`` prints the table of a run's
JSON as docs/benchmarks.md has it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Optional, Sequence

from . import deepspeed_shm, plot
from .common import LABELS, fmt_size, round_plan, write_json
from .progress import Progress

#: The table's sides, in its order; the doors are rustdist's two.
PEERS = ("deepspeed", "rustdist-torch", "rustdist-swap", "gloo")
DOORS = ("rustdist-torch", "rustdist-swap")
#: Runs one world of the run's options, calling back with each event (cli._run).
RunWorld = Callable[[argparse.Namespace, int, Callable[[dict[str, Any]], None], Progress], None]

#: The table's short names of the sides (the doors are rustdist's).
_SHORT = {"deepspeed": "DeepSpeed", "rustdist-torch": "torch door",
          "rustdist-swap": "import swap", "gloo": "gloo"}
_COLUMNS = [f"{_SHORT[p]} us" for p in PEERS] + [f"{_SHORT[d]} vs DS" for d in DOORS]


def header() -> str:
    """The column names of a table of one world and dtype."""
    return " | ".join([f"{'size':>8}"] + [f"{c:>{max(9, len(c))}}" for c in _COLUMNS])


def fmt_row(row: dict[str, Any]) -> str:
    """One result row under :func:`header`: each side's us (WRONG where its result was wrong,
    - where it did not run) and DeepSpeed's time over each door's."""
    cells = []
    for p in PEERS:
        peer = row["peers"].get(p)
        cells.append("-" if peer is None else "WRONG" if not peer["correct"]
                     else f"{peer['us']:.1f}")
    cells += [f"{r:.2f}x" if r is not None else "-"
              for r in (row["vs_deepspeed"].get(d) for d in DOORS)]
    return " | ".join([f"{fmt_size(row['bytes']):>8}"]
                      + [f"{v:>{max(9, len(c))}}" for v, c in zip(cells, _COLUMNS)])


def vs_deepspeed(row: dict[str, Any]) -> dict[str, float]:
    """DeepSpeed's time over each door's (above 1: rustdist ahead), where both were timed."""
    ds = row["peers"].get("deepspeed", {}).get("us")
    return {d: ds / row["peers"][d]["us"] for d in DOORS
            if ds and "us" in row["peers"].get(d, {})}


def summarize(rows: Sequence[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Each door's least ratio to DeepSpeed (and where) per world and dtype; the wrong
    results; the run's seconds."""
    least = []
    for door in DOORS:
        for world, dtype in dict.fromkeys((r["world"], r["dtype"]) for r in rows):
            mine = [r for r in rows if (r["world"], r["dtype"]) == (world, dtype)
                    and door in r["vs_deepspeed"]]
            if mine:
                worst = min(mine, key=lambda r: r["vs_deepspeed"][door])
                least.append({"door": door, "world": world, "dtype": dtype,
                              "ratio": worst["vs_deepspeed"][door], "bytes": worst["bytes"],
                              "every_size": all(r["vs_deepspeed"][door] >= 1.0 for r in mine)})
    wrong = [{"peer": p, **{k: r[k] for k in ("world", "dtype", "bytes")}}
             for r in rows for p, v in r["peers"].items() if not v["correct"]]
    return {"seconds": seconds, "least_vs_deepspeed": least, "wrong": wrong}


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as printed lines."""
    lines = [f"{LABELS[x['door']]} vs DeepSpeed, world {x['world']} {x['dtype']}: least "
             f"{x['ratio']:.2f}x ({fmt_size(x['bytes'])})"
             + (", at or ahead at every size" if x["every_size"] else "")
             for x in summary["least_vs_deepspeed"]]
    lines += [f"WRONG RESULT: {LABELS[w['peer']]} {w['dtype']} {fmt_size(w['bytes'])} at world "
              f"{w['world']}" for w in summary["wrong"]]
    return lines + [f"{summary['seconds']:.0f} s"]


def markdown_table(rows: Sequence[dict[str, Any]], world: int) -> str:
    """docs/benchmarks.md's table of one world: a row per dtype and size (``python -m
    rustdist.bench.vs_deepspeed RESULTS.json [WORLD]`` prints it from a run's JSON)."""

    def us(row: dict[str, Any], peer: str) -> str:
        t = row["peers"].get(peer, {}).get("us")
        return "—" if t is None else f"{t:.1f}" if t < 100 else f"{t:.0f}"

    def ratio(row: dict[str, Any], door: str) -> str:
        r = row["vs_deepspeed"].get(door)
        return "—" if r is None else f"{r:.2f}x"

    lines = ["| dtype | bytes | " + " | ".join(f"{LABELS[p]} (us)" for p in PEERS) + " | "
             + " | ".join(f"{_SHORT[d]} vs DeepSpeed" for d in DOORS) + " |",
             "|---" * (2 + len(PEERS) + len(DOORS)) + "|"]
    lines += [f"| {r['dtype']} | {fmt_size(r['bytes'])} | "
              + " | ".join([us(r, p) for p in PEERS] + [ratio(r, d) for d in DOORS]) + " |"
              for r in rows if r["world"] == world]
    return "\n".join(lines)


def _binding(args: argparse.Namespace, world: int, cores: int) -> Optional[str]:
    """What the table of a world with more ranks than cores should be read with, or None."""
    if world <= cores:
        return None
    how = (f"rank r on core r mod {cores}" if args.bind
           else "unbound (--no-bind): where the scheduler puts them")
    return (f"world {world} on {cores} cores: {-(-world // cores)} ranks a core, {how}. "
            "DeepSpeed's waiters spin without yielding, so a call of its waits for the "
            "scheduler to switch ranks (milliseconds); with a core per rank it would not")


def _op_lines(op: deepspeed_shm.Op, dtypes: Sequence[str]) -> list[str]:
    """What the run says about DeepSpeed's op once it was built (or not)."""
    if op.problem:
        return [f"DeepSpeed skipped: {op.problem}", "the other sides run without it"]
    runs = op.dtypes(tuple(dtypes))
    lines = [f"DeepSpeed {op.version}: its op is ready ({op.seconds:.0f} s; {op.compiler}; "
             f"vector kernel level {op.level}, "
             f"{deepspeed_shm.LEVEL_NAMES.get(op.level, '?')}): it runs "
             f"{', '.join(runs) or 'none of the dtypes asked for'}"]
    lines += [f"DeepSpeed skipped for {d}: this CPU lacks the vector instructions its kernel "
              "needs (it would fall back to torch.distributed.all_reduce)"
              for d in dtypes if d not in runs]
    return lines


def run(args: argparse.Namespace, mach: dict[str, Any], run_world: RunWorld) -> int:
    """Builds DeepSpeed's op, runs every world with its sides, prints the tables and the
    summary, writes the JSON and the plots; 1 when a result was wrong."""
    directory = deepspeed_shm.build_dir(args.json)
    op = deepspeed_shm.build(directory, say=lambda line: print(line, flush=True))
    print("\n".join(_op_lines(op, args.dtypes)))
    args.deepspeed_dtypes = list(op.dtypes(tuple(args.dtypes)))
    peers = [p for p in PEERS if p != "deepspeed" or args.deepspeed_dtypes]
    if op.version:
        mach["deepspeed"] = op.version
    rounds, round_s = round_plan(args.quick)
    print(f"all_reduce: {' vs '.join(LABELS[p] for p in peers)} | {mach['cpu']} | "
          f"{mach['usable_cores']}/{mach['cores']} cores | Python {mach['python']} | "
          f"torch {mach['torch']} | rustdist {mach['rustdist']} ({mach['rustdist_links']})"
          + (f" | DeepSpeed {op.version}" if op.version else ""))
    print(f"{rounds} alternating rounds of ~{round_s * 1e3:.0f} ms per side, every side on the "
          "same buffers in the same ranks; latency = median over rounds of the slowest rank's "
          "mean per call; torch door and import swap are rustdist's; X vs DS = DeepSpeed us "
          "/ X us (above 1.00x: rustdist ahead)")
    progress = Progress(len(args.world) * len(args.dtypes) * len(args.sizes))
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    with deepspeed_shm.environment(directory):  # the ranks inherit it
        for world in args.world:
            note = _binding(args, world, mach["usable_cores"])
            if note:
                progress.print(f"\n{note}")

            def on_event(ev: dict[str, Any], world: int = world) -> None:
                if ev["event"] == "case":
                    progress.update(label=f"world {world} {ev['dtype']} {fmt_size(ev['bytes'])}")
                    return
                row = {k: v for k, v in ev.items() if k not in ("event", "rank")}
                row["vs_deepspeed"] = vs_deepspeed(row)
                if not rows or (rows[-1]["world"], rows[-1]["dtype"]) != (world, row["dtype"]):
                    progress.print(f"\nworld {world} · all_reduce {row['dtype']}\n{header()}")
                rows.append(row)
                progress.print(fmt_row(row))
                progress.advance()

            run_world(args, world, on_event, progress)
    progress.close()
    summary = summarize(rows, time.perf_counter() - start)
    print("\nsummary: " + "\n         ".join(summary_lines(summary)))
    plots = plot.write_run_plots(rows, args.json, mach)
    write_json(args.json, {
        "machine": mach, "mode": "deepspeed", "peers": peers, "launcher": "processes",
        "binding": ("rank r on core r mod cores where a world has more ranks than cores"
                    if args.bind else "none"),
        "deepspeed": {"version": op.version, "build_dir": op.build_dir,
                      "compiler": op.compiler, "kernel_level": op.level,
                      "build_seconds": op.seconds, "dtypes": args.deepspeed_dtypes,
                      "skipped": op.problem},
        "config": {"worlds": args.world, "ops": args.ops, "dtypes": args.dtypes,
                   "sizes": list(args.sizes), "rounds": rounds, "round_seconds": round_s},
        "results": rows, "summary": summary, "plots": plots})
    return 1 if summary["wrong"] else 0


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        results = json.load(f)["results"]
    print(markdown_table(results, int(sys.argv[2]) if len(sys.argv) > 2 else 2))
