"""``--scale --model JSON...``: what a world of 1k-100k ranks would cost, projected from
measured ``--scale`` runs (their JSON files) and the TCP link model the engine keeps.

Two models per figure. **This machine**: the measured curve of rustdist over TCP fitted by
least squares (coefficients kept non-negative) on terms that say where the time goes:

* init: ``c0 + c1 W + c2 W^2``: a fixed part; the store's O(W) requests, which one thread
  serves (a rank makes O(1) of them, and links only its ring neighbours at init: the rest on
  first use); and the W ranks sharing this machine's cores (zero with a core per rank);
* fds per rank (median): ``f0 + f1 log2 W + f2 W``: a fixed part; the peers of the log2 W
  steps of recursive doubling and the dissemination barrier, linked on first use; and a link
  to every peer (a full mesh, as with ``RUSTDIST_EAGER_CONNECT=1``; zero when links are made
  on demand);
* a latency-bound collective (8 B all_reduce by recursive doubling, the dissemination
  barrier): ``a log2 W + b W + c W^2``: log2 W steps of a message each; each step waiting for
  its peer's turn on one of the cores the W ranks share; and the W ranks waking each other on
  those cores (both zero with a core per rank);
* the 1 MiB all_reduce: the same terms.

The fit is checked by fitting the worlds up to half the largest and predicting the largest
(the error is printed). **A core per rank**: the terms that come from sharing cores are
dropped, each message step costs the link's one-way latency (``--model-latency-us``, default
the engine's reference link, TCP loopback: 40 us) plus the software's own per-step cost (the
smallest measured world's 8 B all_reduce per step, less the reference latency: at world 2
each rank has a core here), and bytes move at the link's bandwidth (``--model-bandwidth``,
default 2 GB/s):

* init(N) = c0 + c1 N (the store's requests, served by one thread);
* fds per rank: the fitted curve at N;
* 8 B all_reduce and barrier: ceil(log2 N) (latency + software step);
* 1 MiB all_reduce: the algorithm the engine picks there (recursive doubling, log2 N steps of
  S, up to 256 KiB scaled by the link's bandwidth-delay product and by how the crossover grows
  with N; else the ring, 2 (N - 1) steps of S / N);
* hosts of k ranks: the collectives run among the N / k host leaders over TCP, plus the
  shared-memory figure of a world of k measured here (rows "rustdist shm"), twice (in and
  out of the host).

For each projected figure the dominant term is named.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Optional, Sequence

PROJECTED_WORLDS = (1024, 4096, 16384, 65536, 100_000)
HOSTS_OF = (1, 8)
REFERENCE_LATENCY_US = 40.0
REFERENCE_BANDWIDTH = 2e9
MESSAGE_BYTES = 1 << 20

Terms = Callable[[float], list[float]]
INIT_TERMS: Terms = lambda w: [1.0, w, w * w]  # noqa: E731
STEP_TERMS: Terms = lambda w: [math.log2(w), w, w * w]  # noqa: E731
STEP_NAMES = ("log2 W steps", "shared cores", "shared cores, waking")
FDS_TERMS: Terms = lambda w: [1.0, math.log2(w), w]  # noqa: E731
FIGURES: dict[str, tuple[str, Terms, tuple[str, ...]]] = {
    "init_s": ("init s", INIT_TERMS, ("fixed", "store requests", "shared cores")),
    "fds_median": ("fds per rank", FDS_TERMS, ("fixed", "log2 W partners", "per peer")),
    "all_reduce_8B_us": ("8 B all_reduce us", STEP_TERMS, STEP_NAMES),
    "barrier_us": ("barrier us", STEP_TERMS, STEP_NAMES),
    "all_reduce_1MiB_us": ("1 MiB all_reduce us", STEP_TERMS, STEP_NAMES),
}


def figure(row: dict[str, Any], key: str) -> Optional[float]:
    """A row's figure `key` (a latency case lives under ``cases``)."""
    if key in row:
        return row[key]
    case = row.get("cases", {}).get(key[:-3])
    return case.get("us") if case else None


def fit(points: Sequence[tuple[float, float]], terms: Terms) -> list[float]:
    """Non-negative least squares on `terms`: drops a term whose coefficient comes out
    negative and fits the rest again."""
    import numpy as np

    active = list(range(len(terms(1.0))))
    while True:
        a = np.array([[terms(w)[i] for i in active] for w, _ in points])
        b = np.array([y for _, y in points])
        coef = np.linalg.lstsq(a, b, rcond=None)[0] if active else np.array([])
        if all(c >= 0 for c in coef):
            out = [0.0] * len(terms(1.0))
            for i, c in zip(active, coef):
                out[i] = float(c)
            return out
        active.pop(int(np.argmin(coef)))


def evaluate(coef: Sequence[float], terms: Terms, world: float) -> float:
    return sum(c * t for c, t in zip(coef, terms(world)))


def measured(rows: Sequence[dict[str, Any]], label: str, key: str) -> list[tuple[float, float]]:
    """(world, figure) of the rows of `label` that ran ok."""
    out = []
    for r in rows:
        value = figure(r, key) if r.get("label") == label and r.get("status") == "ok" else None
        if value is not None:
            out.append((float(r["world"]), float(value)))
    return sorted(out)


def check(points: Sequence[tuple[float, float]], terms: Terms) -> Optional[dict[str, float]]:
    """Fits the worlds up to half the largest and predicts the largest."""
    largest = points[-1][0] if points else 0
    early = [p for p in points if p[0] <= largest / 2]
    if len(early) < len(terms(1.0)):
        return None
    predicted = evaluate(fit(early, terms), terms, largest)
    return {"world": largest, "measured": points[-1][1], "predicted": predicted,
            "error_pct": 100 * (predicted - points[-1][1]) / points[-1][1]}


def ring_crossover_growth(world: int) -> float:
    """As ``ring_crossover_growth`` in crates/core/src/algorithms/select/policy.rs."""
    def crossover(n: float) -> float:
        return (2 * (n - 1) - math.log2(n)) / (math.log2(n) - 2 * (n - 1) / n)
    return 1.0 if world <= 4 else crossover(world) / crossover(4)


def step_cost(rows: Sequence[dict[str, Any]], label: str) -> tuple[float, int]:
    """The software's own cost of one message step, in us: the smallest world's 8 B
    all_reduce over its ceil(log2 W) steps, less the reference link's latency (at world 2
    each rank has a core here); and that world."""
    points = measured(rows, label, "all_reduce_8B_us")
    world, us = points[0]
    steps = max(1, math.ceil(math.log2(world)))
    return max(0.0, us / steps - REFERENCE_LATENCY_US), int(world)


def project(coefs: dict[str, list[float]], software: float, shm: dict[int, dict[str, float]],
            world: int, per_host: int, latency_us: float,
            bandwidth: float) -> dict[str, tuple[float, str]]:
    """Each figure at `world` ranks on hosts of `per_host`, a core per rank: (value, the
    dominant term)."""
    leaders = max(1, world // per_host)
    steps = math.ceil(math.log2(leaders)) if leaders > 1 else 0
    out: dict[str, tuple[float, str]] = {}
    c0, c1, _ = coefs["init_s"]
    init_terms = {"fixed": c0, "store requests": c1 * world}
    out["init_s"] = (sum(init_terms.values()), max(init_terms, key=init_terms.__getitem__))
    fds_terms = dict(zip(FIGURES["fds_median"][2], (c * t for c, t in zip(
        coefs["fds_median"], FDS_TERMS(world)))))
    out["fds_median"] = (sum(fds_terms.values()), max(fds_terms, key=fds_terms.__getitem__))
    local = shm.get(per_host, {}) if per_host > 1 else {}
    for key in ("all_reduce_8B_us", "barrier_us"):
        terms = {"link latency": steps * latency_us, "software per step": steps * software,
                 "in the host (shm)": 2 * local.get(key, 0.0)}
        out[key] = (sum(terms.values()), max(terms, key=terms.__getitem__))
    # The engine's choice at 1 MiB: recursive doubling up to 256 KiB scaled by the link's
    # bandwidth-delay product over the reference's (within 1/64x..64x) and by how the
    # crossover grows with the world (select/policy.rs), else the ring.
    bdp_scale = min(64.0, max(1 / 64, latency_us * bandwidth
                              / (REFERENCE_LATENCY_US * REFERENCE_BANDWIDTH)))
    step = latency_us + software
    wire_us = MESSAGE_BYTES / bandwidth * 1e6
    doubling_max = (256 << 10) * bdp_scale * ring_crossover_growth(leaders)
    if MESSAGE_BYTES <= doubling_max or leaders <= 2:
        name, terms = "recursive doubling", {"latency": steps * step,
                                             "bandwidth": steps * wire_us}
    else:
        name, terms = "ring", {"latency": 2 * (leaders - 1) * step,
                               "bandwidth": 2 * (leaders - 1) / leaders * wire_us}
    terms["in the host (shm)"] = 2 * local.get("all_reduce_1MiB_us", 0.0)
    out["all_reduce_1MiB_us"] = (sum(terms.values()),
                                 f"{name}: {max(terms, key=terms.__getitem__)}")
    return out


def model_run(json_paths: Sequence[str], latency_us: float, bandwidth: float) -> int:
    """Reads ``--scale`` JSON files, prints the fit, its check and the projection, and writes
    them next to the first (``<stem>-model.json``)."""
    docs = []
    for path in json_paths:
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    doc, json_path = docs[0], json_paths[0]
    rows = [r for d in docs for r in d["results"]]
    label = "rustdist tcp"
    coefs: dict[str, list[float]] = {}
    report: dict[str, Any] = {"sources": list(json_paths), "latency_us": latency_us,
                              "bandwidth": bandwidth, "fit": {}, "projection": []}
    print(f"--scale --model from {', '.join(json_paths)} ({label}; {doc['machine'].get('cpu')}, "
          f"{doc['machine'].get('usable_cores')} cores, rustdist at "
          f"{doc['machine'].get('commit')})")
    print("| figure | terms (fitted coefficients) | fit on worlds <= W/2, predicted at W |")
    print("|---|---|---|")
    for key, (name, terms, term_names) in FIGURES.items():
        points = measured(rows, label, key)
        if len(points) < len(terms(1.0)):
            print(f"| {name} | too few worlds measured ({len(points)}) | |")
            return 1
        coefs[key] = fit(points, terms)
        checked = check(points, terms)
        report["fit"][key] = {"coefficients": dict(zip(term_names, coefs[key])),
                              "points": points, "check": checked}
        said = ", ".join(f"{n} {c:.3g}" for n, c in zip(term_names, coefs[key]))
        verdict = ("-" if checked is None else
                   f"W={checked['world']:.0f}: {checked['predicted']:.3g} against "
                   f"{checked['measured']:.3g} measured ({checked['error_pct']:+.0f}%)")
        print(f"| {name} | {said} | {verdict} |")
    shm = {int(r["world"]): {k: figure(r, k) or 0.0 for k in FIGURES}
           for r in rows if r.get("label") == "rustdist shm" and r.get("status") == "ok"}
    software, smallest = step_cost(rows, label)
    report["software_step_us"] = software
    print(f"\nA core per rank, links of {latency_us:g} us and {bandwidth / 1e9:g} GB/s, "
          f"{software:.3g} us of software per message step (world {smallest}'s 8 B "
          "all_reduce less the reference latency); value, and its dominant term:")
    print("| ranks | per host | init s | fds per rank | 8 B all_reduce us | barrier us |"
          " 1 MiB all_reduce us |")
    print("|---|---|---|---|---|---|---|")
    for world in PROJECTED_WORLDS:
        for per_host in HOSTS_OF:
            p = project(coefs, software, shm, world, per_host, latency_us, bandwidth)
            report["projection"].append({"world": world, "per_host": per_host,
                                         **{k: {"value": v, "dominant": d}
                                            for k, (v, d) in p.items()}})
            cells = " | ".join(f"{v:.3g} ({d})" for v, d in p.values())
            print(f"| {world} | {per_host} | {cells} |")
    out = (json_path[:-5] if json_path.endswith(".json") else json_path) + "-model.json"
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"\nmodel written to {out}")
    return 0
