"""``--train ddp`` / ``--train fsdp2``: a training step, not only a collective.

A transformer encoder (default: d_model 768, 6 layers, 12 heads, an 8192-token embedding and
output layer, 55 M parameters), batch 1 x 32 tokens of synthetic data, SGD, one thread per
rank, under DDP (default buckets) or FSDP2 (each layer and the root sharded; ``--mixed``:
bf16 parameters and gradient reduction). Each side runs in a world of its own, started
afresh: torch's gloo, rustdist through torch's door (``init_process_group("rustdist")``) and
through the import swap (``import rustdist as dist``, ``init_process_group("gloo")``).

For each side and world (``train_rank.py``), in rounds that run the three parts in turn (a
part's samples see the same machine as the others' in its round): the step (its phases:
forward, backward, optimizer); the step's compute alone (DDP: the ``no_sync`` step; FSDP2:
the step with every collective replaced by a local copy of the same sizes, ``localcopy.py``);
the step's collectives alone, back to back on the same side (DDP: its gradient buckets as
rebuilt after the first step, all-reduced; FSDP2: the all-gathers and reduce-scatters the
step issued). The floor is compute alone plus collectives alone; step/floor is the median of
the rounds' ratios, with its quartiles. For DDP also step/(floor + DDP's copies): the floor
with the copies DDP itself makes in a step that its ``no_sync`` step does not, which no
backend can take off it. Where the time goes: forward, backward compute,
copies (torch.profiler: copy_/div_/mul_/mul in one profiled step; DDP: beyond those of one
profiled ``no_sync`` step, i.e. its bucket copies and division; FSDP2: its copy-in/out),
waiting (the backward's time beyond compute and copies),
optimizer; and the CPU time the rank's threads ran (the kernel's per-thread counters): the
calling thread's in a step and in compute alone, the other threads' (the engine's, or
gloo's) in a step and in the collectives alone. Figures are rank 0's. Each side's world runs
``--train-passes`` times (sides in alternating order) and its rounds are pooled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from . import plot
from .launch import free_port

#: The sides, by the name the results use (train_rank.py joins each world).
SIDES = ("gloo", "rustdist", "rustdist-swap")

#: How long one side's world may take (its warm-up, three timed parts, a profiled step).
WORLD_TIMEOUT_S = 1200
LABELS = {"gloo": "gloo", "rustdist": "rustdist (torch door)",
          "rustdist-swap": "rustdist (import swap)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``--train``."""
    p.add_argument("--train", choices=["ddp", "fsdp2"],
                   help="a training step under DDP or FSDP2 on each side, against its floor")
    p.add_argument("--train-steps", type=int, default=10,
                   help="timed rounds per world with --train (default: 10)")
    p.add_argument("--train-passes", type=int, default=2,
                   help="worlds per side with --train, in alternating order, their rounds "
                        "pooled (default: 2)")
    p.add_argument("--mixed", action="store_true",
                   help="--train fsdp2: bf16 parameters and gradient reduction")
    p.add_argument("--bucket-view", action="store_true",
                   help="--train ddp: gradient_as_bucket_view=True")
    p.add_argument("--d-model", type=int, default=768, help="--train: model width")
    p.add_argument("--layers", type=int, default=6, help="--train: encoder layers")
    p.add_argument("--vocab", type=int, default=8192, help="--train: vocabulary")
    p.add_argument("--tokens", type=int, default=32, help="--train: tokens per batch")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                   help="--train: the sides to run (default: all)")


def _world(args: argparse.Namespace, side: str, world: int) -> dict[str, Any]:
    """Runs one side's world; returns rank 0's results."""
    with tempfile.TemporaryDirectory(prefix="rustdist-train-") as run:
        cfg = {"side": side, "kind": args.train, "world": world, "port": free_port(),
               "vocab": args.vocab, "d_model": args.d_model, "layers": args.layers,
               "heads": max(1, args.d_model // 64), "tokens": args.tokens,
               "warmup": 3, "steps": args.train_steps, "mixed": args.mixed,
               "bucket_view": args.bucket_view}
        path = os.path.join(run, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        procs = [subprocess.Popen([sys.executable, "-m", "rustdist.bench.train_rank", path,
                                   str(r)], stdin=subprocess.DEVNULL)
                 for r in range(world)]
        try:
            codes = [p.wait(timeout=WORLD_TIMEOUT_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"{side}, world {world}: a rank failed (exit codes {codes})")
        with open(os.path.join(run, "rank0.json"), encoding="utf-8") as f:
            return json.load(f)


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's passes as one: their rounds together, the median of their profiled copies,
    the rest (buckets or collectives, parameters) from the first."""
    first = runs[0]
    return {**first,
            "samples": {part: [s for r in runs for s in r["samples"][part]]
                        for part in first["samples"]},
            **{key: statistics.median(r[key] for r in runs)
               for key in ("copies_ms", "compute_copies_ms") if key in first},
            "passes": len(runs)}


def _median(samples: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """A side's figures: medians (ms) over the rounds, the step's ratio to its floor (the
    median of each round's step over that round's compute plus collectives, with its
    quartiles), and where the step's time and CPU go."""
    sm = r["samples"]
    step, compute, alone = sm["step"], sm["compute"], sm["alone"]
    ratios = [s["step"] / (c["step"] + a["step"]) for s, c, a in zip(step, compute, alone)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    backward_compute = _median(compute, "backward")
    ddp = "compute_copies_ms" in r
    copies = r["copies_ms"] - r["compute_copies_ms"] if ddp else r["copies_ms"]
    with_copies = statistics.median(s["step"] / (c["step"] + a["step"] + copies)
                                    for s, c, a in zip(step, compute, alone)) if ddp else None
    return {"step": _median(step, "step"), "compute": _median(compute, "step"),
            "alone": _median(alone, "step"),
            "floor": _median(compute, "step") + _median(alone, "step"),
            "ratio": statistics.median(ratios), "ratio_q1": q1, "ratio_q3": q3,
            "ratio_with_copies": with_copies,
            "forward": _median(step, "forward"),
            "backward_compute": backward_compute,
            "copies": copies,
            "waiting": max(0.0, _median(step, "backward") - backward_compute - copies),
            "optimizer": _median(step, "optimizer"),
            "cpu_main_step": _median(step, "cpu_main"),
            "cpu_main_compute": _median(compute, "cpu_main"),
            "cpu_comm_step": _median(step, "cpu_others"),
            "cpu_comm_alone": _median(alone, "cpu_others")}


#: "step - compute" is what being distributed costs a step; unlike the step itself it barely
#: moves when the host's speed drifts between one side's world and the next.
TABLE = ("| world | side | step ms | compute alone ms | collectives alone ms | floor ms | "
         "step/floor (quartiles) | step/(floor + DDP's copies) | step - compute ms | "
         "vs gloo (step) | copies ms | main thread CPU ms (step / compute) | "
         "comm threads CPU ms (step / alone) |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _row(world: int, side: str, s: dict[str, Any], gloo: float) -> str:
    vs = f"{gloo / s['step']:.2f}x" if gloo else ""
    ratio = s.get("ratio_with_copies")
    with_copies = "—" if ratio is None else f"{ratio:.2f}"
    return (f"| {world} | {LABELS[side]} | {s['step']:.0f} | {s['compute']:.0f} | "
            f"{s['alone']:.0f} | {s['floor']:.0f} | {s['ratio']:.2f} "
            f"({s['ratio_q1']:.2f}–{s['ratio_q3']:.2f}) | {with_copies} | "
            f"{s['step'] - s['compute']:.0f} | "
            f"{vs} | {s['copies']:.0f} | "
            f"{s['cpu_main_step']:.0f} / {s['cpu_main_compute']:.0f} | "
            f"{s['cpu_comm_step']:.0f} / {s['cpu_comm_alone']:.0f} |")


def _plot(results: list[dict[str, Any]], json_path: str, title: str) -> str:
    """A PNG of each side's step split into its phases, beside its floor."""
    from matplotlib.figure import Figure

    worlds = sorted({r["world"] for r in results})
    fig = Figure(figsize=(5.5 * len(worlds), 5), layout="constrained")
    axes = fig.subplots(1, len(worlds), squeeze=False)[0]
    phases = ("forward", "backward_compute", "copies", "waiting", "optimizer")
    for ax, world in zip(axes, worlds):
        here = [r for r in results if r["world"] == world]
        names = [LABELS[r["side"]] for r in here]
        bottom = [0.0] * len(here)
        for phase in phases:
            vals = [r["summary"][phase] for r in here]
            ax.bar(names, vals, bottom=bottom, label=phase.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.scatter(names, [r["summary"]["floor"] for r in here], color="black", marker="_",
                   s=2000, label="floor", zorder=3)
        ax.set_title(f"world {world}")
        ax.set_ylabel("ms per step")
        ax.tick_params(axis="x", labelsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    fig.suptitle(title, fontsize=10)
    path = plot.plot_path(json_path, "train")
    fig.savefig(path, dpi=100)
    return path


def train_run(args: argparse.Namespace, mach: dict[str, Any]) -> int:
    """Every side at every world size: prints the table, writes the JSON and the PNG."""
    what = args.train + (" (bf16)" if args.mixed else "") + \
        (" gradient_as_bucket_view" if args.bucket_view else "")
    print(f"--train {what} | {mach['cpu']} | {mach['usable_cores']}/{mach['cores']} cores | "
          f"{args.train_steps} rounds x {args.train_passes} passes per side, medians", flush=True)
    print(TABLE, flush=True)
    results = []
    for world in args.world:
        # Each side's world runs once per pass, the order reversed every other pass, and a
        # side's rounds are pooled: the host's speed drifts between worlds minutes apart.
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
        for n in range(args.train_passes):
            for side in args.sides if n % 2 == 0 else reversed(args.sides):
                runs[side].append(_world(args, side, world))
        gloo = 0.0
        for side in args.sides:
            raw = pooled(runs[side])
            s = summarize(raw)
            gloo = s["step"] if side == "gloo" else gloo
            print(_row(world, side, s, gloo), flush=True)
            results.append({"world": world, "side": side, "summary": s, "raw": raw})
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"machine": mach, "mode": f"train-{args.train}",
                   "config": {k: getattr(args, k) for k in
                              ("train", "mixed", "bucket_view", "d_model", "layers", "vocab",
                               "tokens", "train_steps", "train_passes", "world", "sides")},
                   "results": results}, f, indent=1)
    print(f"results written to {args.json}")
    if plot.available():
        title = f"--train {what}, {mach['cpu']}"
        print(f"plot written: {_plot(results, args.json, title)}")
    return 0
