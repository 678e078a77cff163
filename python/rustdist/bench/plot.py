"""A PNG per collective next to the JSON results: latency (log-log) and busbw against size,
a line per peer, a column of panels per world size. Needs matplotlib (requirements-bench.txt,
which ./dev bench installs); nothing else in the benchmark does."""

from __future__ import annotations

import os
from typing import Any, Sequence

from .common import LABELS, fmt_size

MISSING = "matplotlib is not installed (./dev bench installs it)"


def available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_path(json_path: str, name: str) -> str:
    """Where the plot `name` (an op, maybe with its dtype) goes: ``results.json`` ->
    ``results-all_reduce.png``."""
    stem = json_path[:-5] if json_path.endswith(".json") else json_path
    return f"{stem}-{name}.png"


def write_plots(rows: Sequence[dict[str, Any]], json_path: str, title: str) -> list[str]:
    """Writes one PNG per collective in `rows` (the benchmark's result rows), and per dtype
    where a row is not float32 (``<op>-<dtype>`` in the name); returns the paths. `title` goes
    under each figure's heading (the machine, say)."""
    from matplotlib.figure import Figure

    def dtype(row: dict[str, Any]) -> str:
        return str(row.get("dtype", "float32"))

    named = {dtype(r) for r in rows} != {"float32"}
    paths = []
    for op, kind in dict.fromkeys((r["op"], dtype(r)) for r in rows):
        mine = [r for r in rows if (r["op"], dtype(r)) == (op, kind)]
        worlds = sorted({r["world"] for r in mine})
        fig = Figure(figsize=(5.5 * len(worlds), 8), layout="constrained")
        axes = fig.subplots(2, len(worlds), squeeze=False)
        for col, world in enumerate(worlds):
            here = sorted((r for r in mine if r["world"] == world), key=lambda r: r["bytes"])
            lat, bw = axes[0][col], axes[1][col]
            for peer in dict.fromkeys(p for r in here for p in r["peers"]):
                timed = [r for r in here if "us" in r["peers"].get(peer, {})]
                sizes = [r["bytes"] for r in timed]
                label = LABELS.get(peer, peer)
                lat.plot(sizes, [r["peers"][peer]["us"] for r in timed], marker="o", label=label)
                bw.plot(sizes, [r["peers"][peer]["busbw_gbps"] for r in timed], marker="o",
                        label=label)
            lat.set_yscale("log")
            lat.set_ylabel("latency (us)")
            bw.set_ylabel("busbw (GB/s)")
            lat.set_title(f"world {world}")
            for ax in (lat, bw):
                ax.set_xscale("log", base=2)
                ticks = [r["bytes"] for r in here]
                ax.set_xticks(ticks, [fmt_size(t) for t in ticks], rotation=45, fontsize=8)
                ax.set_xlabel(f"size ({kind})")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=8)
        name = f"{op}-{kind}" if named else op
        fig.suptitle(f"{name}\n{title}", fontsize=10)
        path = plot_path(json_path, name)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def write_run_plots(rows: Sequence[dict[str, Any]], json_path: str,
                    mach: dict[str, Any]) -> list[str]:
    """A run's plots beside its JSON, titled with its machine (``common.machine()``); prints
    where they went, or why there are none."""
    if not available():
        print(f"plots skipped: {MISSING}")
        return []
    paths = write_plots(rows, json_path, f"{mach['cpu']}, {mach['usable_cores']} cores, "
                                         f"torch {mach['torch']}, rustdist {mach['rustdist']}")
    print(f"plots written: {', '.join(paths)}")
    return paths
