"""The printed tables and the summary of a comparison run."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .common import LABELS, SIZES, fmt_size


def _short(peer: str) -> str:
    return LABELS.get(peer, peer)


def header(peers: Sequence[str]) -> str:
    """The column names of a table of `peers` (the first is rustdist, the base of speed-ups)."""
    names = [f"{_short(p)} us" for p in peers] + [f"{_short(p)} busbw" for p in peers]
    names += [f"vs {_short(p)}" for p in peers[1:]]
    return " | ".join([f"{'size':>8}"] + [f"{n:>{_width(n)}}" for n in names])


def _width(name: str) -> int:
    return max(len(name), 9)


def fmt_row(row: dict[str, Any], peers: Sequence[str]) -> str:
    """One result row under :func:`header` (latency in us, busbw in GB/s; WRONG where a
    result was wrong)."""

    def cell(peer: str, key: str, title: str, fmt: str) -> str:
        p = row["peers"][peer]
        return f"{'WRONG' if not p['correct'] else format(p[key], fmt):>{_width(title)}}"

    cols = [f"{fmt_size(row['bytes']):>8}"]
    cols += [cell(p, "us", f"{_short(p)} us", ".1f") for p in peers]
    cols += [cell(p, "busbw_gbps", f"{_short(p)} busbw", ".3f") for p in peers]
    for p in peers[1:]:
        s = row["speedup"].get(f"vs_{p}")
        cols.append(f"{'-' if s is None else f'{s:.2f}x':>{_width(f'vs {_short(p)}')}}")
    return " | ".join(cols)


def summarize(rows: Sequence[dict[str, Any]], fronts: Sequence[dict[str, Any]],
              peers: Sequence[str], seconds: float) -> dict[str, Any]:
    """The run's summary: the smallest speed-up against each peer (and where), the 8-byte
    all_reduce at world 2, the front door's overhead per world, the wrong results."""
    out: dict[str, Any] = {"seconds": seconds, "min_speedup": {}}
    for p in peers[1:]:
        key = f"vs_{p}"
        with_it = [r for r in rows if key in r["speedup"]]
        if with_it:
            worst = min(with_it, key=lambda r: r["speedup"][key])
            out["min_speedup"][p] = {"speedup": worst["speedup"][key],
                                     **{k: worst[k] for k in ("world", "op", "bytes")}}
    small = _find(rows, "all_reduce", 2, SIZES[0])
    out["all_reduce_8B_world2_us"] = (
        {p: small["peers"][p].get("us") for p in peers} if small else None)
    out["front_door_overhead_us"] = {f["world"]: f["overhead_us"] for f in fronts}
    out["wrong"] = [{"peer": p, **{k: r[k] for k in ("world", "op", "bytes")}}
                    for r in rows for p, v in r["peers"].items() if not v["correct"]]
    return out


def _find(rows: Sequence[dict[str, Any]], op: str, world: int,
          nbytes: int) -> Optional[dict[str, Any]]:
    return next((r for r in rows if (r["op"], r["world"], r["bytes"]) == (op, world, nbytes)),
                None)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as printed lines."""
    lines = []
    for p, w in summary["min_speedup"].items():
        lines.append(f"min speed-up vs {_short(p)}: {w['speedup']:.2f}x (world {w['world']} "
                     f"{w['op']} {fmt_size(w['bytes'])})")
    small = summary["all_reduce_8B_world2_us"]
    if small:
        lines.append("8 B all_reduce at world 2: " + ", ".join(
            f"{_short(p)} {us:.1f} us" for p, us in small.items() if us is not None))
    for world, us in summary["front_door_overhead_us"].items():
        lines.append(f"torch front door overhead at world {world}: {us:.1f} us")
    for w in summary["wrong"]:
        lines.append(f"WRONG RESULT: {_short(w['peer'])} {w['op']} {fmt_size(w['bytes'])} at "
                     f"world {w['world']}")
    lines.append(f"{summary['seconds']:.0f} s")
    return lines


def front_door_line(row: dict[str, Any]) -> str:
    """The front-door result as printed lines."""
    a = row["async"]
    return (f"world {row['world']} · 8 B all_reduce, torch front door: torch.distributed on "
            f"rustdist's group {row['torch_front_door_us']:.1f} us, rustdist API "
            f"{row['rustdist_us']:.1f} us, overhead {row['overhead_us']:.1f} us\n"
            f"world {row['world']} · 8 B all_reduce, asynchronous and waited for: rustdist API "
            f"{a['rustdist_us']:.1f} us, torch front door {a['torch_front_door_us']:.1f} us "
            f"(gloo {a['gloo_us']:.1f} us), functional collective {a['functional_us']:.1f} us "
            f"(gloo {a['gloo_functional_us']:.1f} us)")
