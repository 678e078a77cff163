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


def plot_path(json_path: str, op: str) -> str:
    """Where the plot of `op` goes: ``results.json`` -> ``results-all_reduce.png``."""
    stem = json_path[:-5] if json_path.endswith(".json") else json_path
    return f"{stem}-{op}.png"


def write_plots(rows: Sequence[dict[str, Any]], json_path: str, title: str) -> list[str]:
    """Writes one PNG per collective in `rows` (the benchmark's result rows); returns the
    paths. `title` goes under each figure's heading (the machine, say)."""
    from matplotlib.figure import Figure

    paths = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
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
                ax.set_xlabel("size (float32)")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle(f"{op}\n{title}", fontsize=10)
        path = plot_path(json_path, op)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths
