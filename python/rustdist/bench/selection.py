"""``--show-selection``: the algorithm rustdist's engine picks per (collective, link kind, world
size, bytes), from ``rustdist._core.selection_table(worlds, sizes)``, which returns tuples
``(collective, link kind, world, bytes, algorithm)``; link kinds are e.g. "shm", "tcp",
"hierarchical"."""

from __future__ import annotations

from typing import Sequence

from .common import fmt_size

Entry = tuple[str, str, int, int, str]


def selection_table(worlds: Sequence[int], sizes: Sequence[int]) -> list[Entry]:
    """The engine's table for `worlds` x `sizes`; RuntimeError when this build lacks it."""
    from .. import _core

    table = getattr(_core, "selection_table", None)
    if table is None:
        raise RuntimeError(
            "this rustdist build has no rustdist._core.selection_table (the engine's algorithm "
            "selection table, added by a newer engine): rebuild the wheel from a checkout "
            "that has it")
    return [tuple(e) for e in table(list(worlds), list(sizes))]  # type: ignore[misc]


def format_selection(entries: Sequence[Entry]) -> str:
    """One table per collective (in the order the entries name them): a column per (link
    kind, world), a row per size, consecutive sizes that pick the same algorithms merged into
    one row ("8 B .. 64 KiB")."""
    blocks = []
    for coll in dict.fromkeys(e[0] for e in entries):
        mine = [e for e in entries if e[0] == coll]
        links = list(dict.fromkeys(e[1] for e in mine))
        cols = sorted({(e[1], e[2]) for e in mine}, key=lambda c: (links.index(c[0]), c[1]))
        algo = {(e[1], e[2], e[3]): e[4] for e in mine}
        rows: list[tuple[int, int, tuple[str, ...]]] = []  # (first bytes, last bytes, cells)
        for nbytes in sorted({e[3] for e in mine}):
            cells = tuple(algo.get((link, world, nbytes), "-") for link, world in cols)
            if rows and rows[-1][2] == cells:
                rows[-1] = (rows[-1][0], nbytes, cells)
            else:
                rows.append((nbytes, nbytes, cells))
        table = [("bytes", *(f"{link} world {world}" for link, world in cols))]
        table += [(fmt_size(lo) if lo == hi else f"{fmt_size(lo)} .. {fmt_size(hi)}", *cells)
                  for lo, hi, cells in rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
                 for r in table]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        blocks.append("\n".join([coll, *lines]))
    return "\n\n".join(blocks)
