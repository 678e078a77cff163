"""``python -m rustdist.status HOST:PORT``: what a running job is doing, asked without pausing it.

HOST:PORT is the job's store (``MASTER_ADDR:MASTER_PORT``, the address the ranks rendezvoused
at; rustdist's own store or torch's). Every rank of the world publishes there, at init, where
its heartbeats answer (:func:`publish`); the query reads those addresses in one request and
asks every rank at once over UDP. A rank's heartbeat thread answers with what each group of
its process is in (operation, sequence number, state, for how long) and its last completed
operation, from the flight recorder; the process itself is not interrupted. A rank that does
not answer within the timeout is shown as dead (or its heartbeats are off:
``RUSTDIST_HEARTBEAT_INTERVAL=0``). Under ``RUSTDIST_AUTH_KEY`` the queries and answers are signed
with the key, and ranks ignore unsigned queries.

The verdict says, per group, which ranks wait in a collective for which others, and what
those are doing instead (another group's operation, nothing in rustdist, or dead).

Each group's counters come along (``rustdist.stats`` in the process): operations and their
bytes by kind, collectives by algorithm, seconds waited for peers.

Options: ``--json`` (one object per rank, with an integer ``rank``), ``--metrics`` (the
counters in the OpenMetrics text format), ``--watch SECONDS`` (repeat until interrupted),
``--timeout SECONDS`` (how long to wait for answers, default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from datetime import timedelta
from typing import Any, Optional

from .. import _core

#: The store keys the ranks publish under: ``KEY_PREFIX + str(global rank)`` and
#: ``KEY_PREFIX + "world"``.
KEY_PREFIX = "rustdist/status/"


def root_store(store: Any) -> Any:
    """The store under every prefix (torch's PrefixStore and rustdist's both say which)."""
    while getattr(store, "underlying_store", None) is not None:
        store = store.underlying_store
    return store


def publish(store: Any, global_rank: int, world_size: int, address: Optional[str]) -> None:
    """Tells the job's store where this rank answers status queries (``address``, its
    heartbeats' socket; None: it does not, alone or with heartbeats off)."""
    if address is None:
        return
    root = root_store(store)
    info = {"addr": address, "pid": os.getpid(), "host": socket.gethostname()}
    root.set(f"{KEY_PREFIX}{global_rank}", json.dumps(info))
    if global_rank == 0:
        root.set(f"{KEY_PREFIX}world", str(world_size))


#: How long rustdist's store client waits for its handshake before trying torch's: a
#: rustdist server answers in microseconds, torch's not at all.
HANDSHAKE_S = 0.5


def _connect(host: str, port: int, timeout: float) -> Any:
    """A client of the job's store: rustdist's, else torch's (a job started through torch's
    ``init_process_group`` or torchrun rendezvoused on torch's TCPStore)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(f"no store listens at {host}:{port} ({e}): is the job running, "
                              "and is this its MASTER_ADDR:MASTER_PORT?") from None
    try:
        return _core.TCPStore(host, port, None, False,
                              timedelta(seconds=min(timeout, HANDSHAKE_S)))
    except Exception as first:  # noqa: BLE001 - torch's store speaks another protocol
        if "no answer from the server" not in str(first):  # refused (a key), not unanswered
            raise
        try:
            from torch.distributed import TCPStore
        except ImportError:
            raise first from None
    try:
        return TCPStore(host, port, None, False, timedelta(seconds=timeout))
    except Exception:  # noqa: BLE001 - a rustdist store too slow to answer the handshake
        return _core.TCPStore(host, port, None, False, timedelta(seconds=timeout))


def _op(o: Optional[dict[str, Any]]) -> str:
    if not o:
        return "-"
    return f"{o['op']} #{o['seq']} {o['state']}"


def query(address: str, timeout: float = 1.0) -> list[dict[str, Any]]:
    """One object per rank of the job whose store is at ``address`` ("host:port"): ``rank``,
    ``alive``, ``host``, ``pid``, ``groups`` (each with ``name``, ``desc``, ``ranks`` (global),
    ``current`` and ``last_completed`` (``op``, ``seq``, ``p2p``, ``state``, ``age_ms``),
    ``stats`` and ``waits_for``, the members it waits for there) and ``waits_for``: the
    global ranks it waits for in any group's collective."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT (the job's store), got {address!r}")
    store = _connect(host.strip("[]"), int(port), timeout)
    world = int(store.get(f"{KEY_PREFIX}world"))
    infos = [json.loads(v) for v in store.multi_get([f"{KEY_PREFIX}{r}" for r in range(world)])]
    answers = _core.ask_status([i["addr"] for i in infos], timeout)
    ranks = []
    for r, (info, answer) in enumerate(zip(infos, answers)):
        state = json.loads(answer) if answer else None
        ranks.append({"rank": r, "alive": state is not None, "host": info["host"],
                      "pid": info["pid"], "addr": info["addr"],
                      "groups": state["groups"] if state else []})
    _judge(ranks)
    return ranks


def _judge(ranks: list[dict[str, Any]]) -> None:
    """Sets each group's and rank's ``waits_for``: in every group where the rank is in
    collective #s, the members that are not in #s yet (in another operation, in none, or
    dead)."""
    by_rank = {r["rank"]: r for r in ranks}

    def in_group(rank: int, name: str) -> Optional[dict[str, Any]]:
        return next((g for g in by_rank[rank]["groups"] if g["name"] == name), None)

    for r in ranks:
        waits: set[int] = set()
        for g in r["groups"]:
            cur = g["current"]
            g["waits_for"] = []
            if not cur or cur["p2p"]:
                continue
            for m in g["ranks"]:
                if m == r["rank"] or m not in by_rank:
                    continue
                other = in_group(m, g["name"])
                there = other["current"] if other else None
                done = (other or {}).get("last_completed") or {}
                arrived = (there and not there["p2p"] and there["seq"] >= cur["seq"]) or (
                    not done.get("p2p") and done.get("seq", 0) >= cur["seq"])
                if not by_rank[m]["alive"] or not arrived:
                    g["waits_for"].append(m)
            waits.update(g["waits_for"])
        r["waits_for"] = sorted(waits)


def _doing(rank: dict[str, Any]) -> str:
    """What a rank others wait for is doing instead, in words."""
    if not rank["alive"]:
        return "dead (no answer)"
    busy = [f"{_op(g['current'])} of group '{_label(g)}' for {g['current']['age_ms'] / 1e3:.1f} s"
            for g in rank["groups"] if g["current"]]
    if busy:
        return "in " + ", ".join(busy)
    last = max((g["last_completed"] for g in rank["groups"] if g["last_completed"]),
               key=lambda o: -o["age_ms"], default=None)
    after = f" (last: {last['op']} #{last['seq']}, {last['age_ms'] / 1e3:.1f} s ago)" if last else ""
    return f"in no operation: computing, or elsewhere{after}"


def _label(g: dict[str, Any]) -> str:
    return g["desc"] if g["desc"] not in ("", "undefined") else g["name"]


def verdict(ranks: list[dict[str, Any]]) -> list[str]:
    """The verdict in words: per group and collective, who waits for whom, and what those are
    doing instead."""
    waits: dict[tuple[str, str, int, tuple[int, ...]], list[int]] = {}
    for r in ranks:
        for g in r["groups"]:
            if g.get("waits_for"):
                cur = g["current"]
                key = (_label(g), cur["op"], cur["seq"], tuple(g["waits_for"]))
                waits.setdefault(key, []).append(r["rank"])
    lines = []
    for (label, op, seq, missing), waiting in waits.items():
        who = f"rank {waiting[0]} waits" if len(waiting) == 1 else \
            f"ranks {', '.join(map(str, waiting))} wait"
        lines.append(f"{who} in {op} #{seq} of group '{label}' for "
                     f"{', '.join(map(str, missing))}:")
        lines.extend(f"  rank {m} is {_doing(ranks[m])}" for m in missing)
    dead = [r["rank"] for r in ranks if not r["alive"]]
    if dead and not waits:
        lines.append(f"no answer from rank(s) {', '.join(map(str, dead))}: dead, or their "
                     "heartbeats are off")
    if not lines:
        lines.append("no rank waits for another")
    return lines


def table(ranks: list[dict[str, Any]]) -> str:
    """One row per rank and group: alive, host, pid, the operation it is in and its last, and
    the group's counters (operations run, seconds waited for peers)."""
    rows = [("rank", "alive", "host", "pid", "group", "in", "for", "last completed", "ops",
             "waited")]
    for r in ranks:
        head = (str(r["rank"]), "yes" if r["alive"] else "DEAD", r["host"], str(r["pid"]))
        if not r["groups"]:
            rows.append(head + ("-",) * 6)
        for i, g in enumerate(r["groups"]):
            cur, st = g["current"], g["stats"]
            rows.append((head if i == 0 else ("", "", "", "")) + (
                _label(g), _op(cur), f"{cur['age_ms'] / 1e3:.1f} s" if cur else "-",
                _op(g["last_completed"]), str(sum(o["count"] for o in st["ops"].values())),
                f"{st['waited_s']:.3f} s"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def _labels(**labels: Any) -> str:
    def escaped(v: Any) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items()) + "}"


def metrics(ranks: list[dict[str, Any]]) -> str:
    """The job's counters in the OpenMetrics text format (for a Prometheus scrape): per rank
    whether it answered, and per rank and group its operations and their bytes by kind, its
    collectives by algorithm and the seconds it waited for peers."""
    families: dict[str, tuple[str, str, list[str]]] = {
        "rustdist_up": ("gauge", "1 when the rank answered the status query", []),
        "rustdist_operations": ("counter", "operations issued, by kind", []),
        "rustdist_operation_bytes": ("counter", "bytes of the operations' inputs", []),
        "rustdist_algorithm_runs": ("counter", "collectives run, by algorithm", []),
        "rustdist_wait_seconds": ("counter", "seconds slept waiting for peers", []),
    }
    for r in ranks:
        families["rustdist_up"][2].append(f"rustdist_up{_labels(rank=r['rank'])} "
                                          f"{int(r['alive'])}")
        for g in r["groups"]:
            at = {"rank": r["rank"], "group": _label(g)}
            st = g["stats"]
            for op, c in st["ops"].items():
                families["rustdist_operations"][2].append(
                    f"rustdist_operations_total{_labels(**at, op=op)} {c['count']}")
                families["rustdist_operation_bytes"][2].append(
                    f"rustdist_operation_bytes_total{_labels(**at, op=op)} {c['bytes']}")
            for key, n in st["algorithms"].items():
                coll, _, algo = key.partition("/")
                families["rustdist_algorithm_runs"][2].append(
                    f"rustdist_algorithm_runs_total{_labels(**at, collective=coll, algorithm=algo)}"
                    f" {n}")
            families["rustdist_wait_seconds"][2].append(
                f"rustdist_wait_seconds_total{_labels(**at)} {st['waited_s']}")
    lines = []
    for name, (kind, help_text, samples) in families.items():
        lines += [f"# TYPE {name} {kind}", f"# HELP {name} {help_text}", *samples]
    return "\n".join([*lines, "# EOF"])


def main(argv: Optional[list[str]] = None) -> int:
    """The command line: prints the job's status (and repeats it with ``--watch``)."""
    p = argparse.ArgumentParser(prog="python -m rustdist.status", description=__doc__.split("\n")[0])
    p.add_argument("address", metavar="HOST:PORT", help="the job's store (MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--json", action="store_true", help="one JSON object per rank")
    p.add_argument("--metrics", action="store_true",
                   help="the counters in the OpenMetrics text format (a Prometheus scrape)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="repeat every SECONDS")
    p.add_argument("--timeout", type=float, default=1.0, metavar="SECONDS",
                   help="how long to wait for the store and the ranks' answers (default 1)")
    args = p.parse_args(argv)
    while True:
        ranks = query(args.address, args.timeout)
        if args.json:
            print(json.dumps(ranks), flush=True)
        elif args.metrics:
            print(metrics(ranks), flush=True)
        else:
            print(table(ranks))
            print("\n".join(verdict(ranks)), flush=True)
        if args.watch is None:
            return 0
        time.sleep(args.watch)
        if not args.json:
            print()

