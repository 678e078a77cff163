"""The flight recorder: what every group of this process did last, for explaining a hang.

Each group (CPU and CUDA) keeps its last ``TORCH_FR_BUFFER_SIZE`` operations (default 128; 0
turns recording off) with torch's fields: sequence numbers, sizes, dtypes, state (scheduled,
started, completed) with timestamps, and the Python stack when ``TORCH_INCLUDE_STACK_TRACE=1``.
The engine writes every group of the process to ``TORCH_FR_DUMP_TEMP_FILE`` + global rank
(default ``/tmp/nccl_trace_rank_<rank>``) in torch's pickle format when a group fails (a
timeout, a dead or silent peer, a mismatch, ``abort()``), and :func:`dump` writes it on demand.
torch's analyzer reads a directory of them unmodified::

    python -m torch.distributed.flight_recorder.fr_trace DIR --prefix nccl_trace_rank_

and ``python -m rustdist.flight_recorder DIR`` prints a per-rank timeline of each group around
its first divergence, with a verdict (:func:`main`).
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import sys
from typing import Any, Optional, Sequence

from .. import _core

Dump = dict[str, Any]
Entry = dict[str, Any]


def dump(prefix: Optional[str] = None) -> str:
    """Writes every group's flight recorder to ``prefix`` followed by this process's global
    rank, in torch's format (``TORCH_FR_DUMP_TEMP_FILE`` when ``prefix`` is None, else
    ``/tmp/nccl_trace_rank_``), whole (written aside, then renamed). Returns the path.

    Raises:
        RuntimeError: before any process group exists (no rank to name the file after), or
            when the file cannot be written.
    """
    return _core.flight_recorder_dump(prefix)


def dump_on_signal(signum: int = signal.SIGUSR1, prefix: Optional[str] = None) -> None:
    """Dumps (as :func:`dump`) whenever this process receives ``signum``; call it from the
    main thread. The dump is taken also while the main thread is blocked in a collective:
    blocking calls run Python's signal handlers as they wait. A handler installed before is
    called after the dump."""
    previous = signal.getsignal(signum)

    def handler(sig: int, frame: Any) -> None:
        try:
            path = dump(prefix)
            print(f"rustdist: flight recorder dumped to {path}", file=sys.stderr, flush=True)
        except RuntimeError as e:
            print(f"rustdist: flight recorder dump failed: {e}", file=sys.stderr, flush=True)
        if callable(previous):
            previous(sig, frame)

    signal.signal(signum, handler)


def capacity() -> int:
    """Entries each group keeps (``TORCH_FR_BUFFER_SIZE``; 0 when recording is off)."""
    return _core.flight_recorder_capacity()


# -- reading dumps ------------------------------------------------------------------------------

_RANKED = re.compile(r"^(.*?)(\d+)$")


def load(directory: str, prefix: Optional[str] = None) -> dict[int, Dump]:
    """The dumps in ``directory`` by global rank: the files named ``prefix`` + rank (the
    prefix common to every file ending in a number when None)."""
    names = sorted(f for f in os.listdir(directory) if _RANKED.match(f))
    if prefix is None:
        prefixes = {m.group(1) for f in names if (m := _RANKED.match(f))}
        if len(prefixes) != 1:
            raise ValueError(f"cannot tell the dumps' prefix in {directory} (found "
                             f"{sorted(prefixes)}); pass --prefix")
        prefix = prefixes.pop()
    dumps: dict[int, Dump] = {}
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            with open(os.path.join(directory, name), "rb") as f:
                dumps[int(name[len(prefix):])] = pickle.load(f)
    if not dumps:
        raise ValueError(f"no dumps named {prefix}<rank> in {directory}")
    return dumps


def _op(e: Entry) -> str:
    """``all_reduce`` of ``gloo:all_reduce``; ``send 0->1`` keeps its peers."""
    return str(e["profiling_name"]).split(":", 1)[-1]


def _seq(e: Entry) -> int:
    return int(e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"])


def _describe(e: Entry) -> str:
    """``barrier #1 of group 'side' (started)``."""
    name, desc = e["process_group"]
    label = desc if desc and desc != "undefined" else name
    return f"{_op(e).split(' ')[0]} #{_seq(e)} of group '{label}' ({e['state']})"


def _last_op(d: Dump) -> Optional[Entry]:
    return max(d["entries"], key=lambda e: e["record_id"], default=None)


class _Group:
    """One group across the dumps: its members and each dumped member's collectives."""

    def __init__(self, name: str, desc: str, members: list[int]) -> None:
        self.name, self.desc, self.members = name, desc, members
        self.by_rank: dict[int, dict[int, Entry]] = {}
        self.p2p: dict[int, list[Entry]] = {}

    @property
    def label(self) -> str:
        return self.desc if self.desc and self.desc != "undefined" else self.name


def _groups(dumps: dict[int, Dump]) -> list[_Group]:
    groups: dict[str, _Group] = {}
    for rank, d in sorted(dumps.items()):
        for name, cfg in d["pg_config"].items():
            members = [int(r) for r in re.findall(r"-?\d+", str(cfg["ranks"]))]
            g = groups.setdefault(name, _Group(name, str(cfg["desc"]), members))
            g.by_rank.setdefault(rank, {})
            g.p2p.setdefault(rank, [])
        for e in d["entries"]:
            g = groups.get(e["process_group"][0])
            if g is None:
                continue
            if e["is_p2p"]:
                g.p2p.setdefault(rank, []).append(e)
            else:
                g.by_rank.setdefault(rank, {})[int(e["collective_seq_id"])] = e
    return list(groups.values())


def _divergence(g: _Group, dumps: dict[int, Dump]) -> tuple[Optional[int], str]:
    """The first collective sequence number where the dumped members disagree (one has not
    reached it, a different op or size, or it has not completed everywhere), and why."""
    ranks = [r for r in g.members if r in g.by_rank]
    seqs = sorted({s for r in ranks for s in g.by_rank[r]})
    for s in seqs:
        here = {r: g.by_rank[r].get(s) for r in ranks}
        # A rank whose ring starts after s has forgotten it (wrapped): not a divergence.
        known = {r: e for r, e in here.items()
                 if e is not None or not g.by_rank[r] or min(g.by_rank[r]) <= s}
        absent = sorted(r for r, e in known.items() if e is None)
        present = {r: e for r, e in known.items() if e is not None}
        first = next(iter(present.values()))
        what = f"{_op(first)} #{s} of group '{g.label}'"
        if absent:
            lines = []
            for r in absent:
                last = _last_op(dumps[r])
                doing = f"its last op is {_describe(last)}" if last else "it recorded nothing"
                lines.append(f"rank {r} never entered {what}; {doing}")
            return s, "; ".join(lines)
        if len({_op(e) for e in present.values()}) > 1:
            calls = ", ".join(f"rank {r} {_op(e)}" for r, e in sorted(present.items()))
            return s, f"ranks called different collectives at #{s} of group '{g.label}': {calls}"
        if len({repr((e["input_sizes"], e["output_sizes"])) for e in present.values()}) > 1:
            sizes = ", ".join(f"rank {r} {e['input_sizes']}" for r, e in sorted(present.items()))
            return s, f"sizes differ in {what}: {sizes}"
        stuck = sorted(r for r, e in present.items() if e["state"] != "completed")
        if stuck:
            return s, (f"{what} did not complete on rank(s) {', '.join(map(str, stuck))} "
                       "(every rank entered it: a peer failed inside it, or it is still running)")
    if not seqs:
        return None, "no collective recorded"
    return None, f"the {len(seqs)} collectives recorded agree on every rank"


def _unmatched_p2p(g: _Group) -> list[str]:
    """Sends no receive took and receives no send matched, per pair of ranks."""
    def count(kind: str, pattern: str) -> dict[tuple[int, int], list[Entry]]:
        out: dict[tuple[int, int], list[Entry]] = {}
        for entries in g.p2p.values():
            for e in entries:
                m = re.fullmatch(pattern, _op(e))
                if _op(e).startswith(kind) and m:
                    a, b = int(m.group(1)), int(m.group(2))
                    out.setdefault((a, b) if kind == "send" else (b, a), []).append(e)
        return out

    sends = count("send", r"send (-?\d+)->(-?\d+)")
    recvs = count("recv", r"recv (-?\d+)<-(-?\d+)")
    lines = []
    for (src, dst) in sorted(set(sends) | set(recvs)):
        s, r = sends.get((src, dst), []), recvs.get((src, dst), [])
        if len(s) > len(r):
            lines.append(f"group rank {src} sent {len(s) - len(r)} message(s) to group rank "
                         f"{dst} that it did not receive (last: {_describe(s[-1])})")
        elif len(r) > len(s):
            lines.append(f"group rank {dst} waits for {len(r) - len(s)} message(s) from group "
                         f"rank {src} that it did not send (last: {_describe(r[-1])})")
    return lines


def _cell(e: Optional[Entry], forgotten: bool) -> str:
    if e is None:
        return "(wrapped)" if forgotten else "-"
    return f"{_op(e)} {e['input_sizes']} {e['state']}"


def timeline(dumps: dict[int, Dump], context: int = 3) -> str:
    """Per group, a table of each rank's collectives around the first divergence (``context``
    before it, and what each rank did after), then a ``verdict:`` line, and the unmatched
    point-to-point messages."""
    out = [f"rustdist flight recorder: {len(dumps)} dump(s), ranks "
           f"{', '.join(map(str, sorted(dumps)))}"]
    for g in _groups(dumps):
        ranks = [r for r in g.members if r in g.by_rank]
        missing = [r for r in g.members if r not in dumps]
        out.append("")
        out.append(f"group {g.name} ({g.label}), ranks {g.members}"
                   + (f"; no dump from rank(s) {missing}" if missing else ""))
        at, why = _divergence(g, dumps)
        seqs = sorted({s for r in ranks for s in g.by_rank[r]})
        if seqs:
            lo = max(seqs[0], (at if at is not None else seqs[-1]) - context)
            shown = [s for s in seqs if s >= lo]
            rows = [["#"] + [f"rank {r}" for r in ranks]]
            for s in shown:
                rows.append([str(s)] + [
                    _cell(g.by_rank[r].get(s), bool(g.by_rank[r]) and s < min(g.by_rank[r]))
                    for r in ranks])
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            for i, row in enumerate(rows):
                mark = "> " if i and at is not None and row[0] == str(at) else "  "
                out.append(mark + " | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        out.append(f"verdict: {why}")
        out.extend(f"point-to-point: {line}" for line in _unmatched_p2p(g))
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m rustdist.flight_recorder DIR [--prefix P] [--context N]``: prints
    :func:`timeline` for the dumps in DIR."""
    import argparse  # here: importing rustdist does not pay for it

    parser = argparse.ArgumentParser(
        prog="python -m rustdist.flight_recorder",
        description="Per-rank timeline of the flight recorder dumps in a directory, around "
                    "each group's first divergence.")
    parser.add_argument("directory")
    parser.add_argument("--prefix", default=None,
                        help="the dumps' file name before the rank (default: inferred)")
    parser.add_argument("--context", type=int, default=3,
                        help="collectives shown before the first divergence")
    args = parser.parse_args(argv)
    try:
        dumps = load(args.directory, args.prefix)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(timeline(dumps, args.context))
    return 0


__all__ = ["capacity", "dump", "dump_on_signal", "load", "main", "timeline"]
