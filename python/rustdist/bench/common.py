"""What the launcher and the ranks share: the run's configuration, sizes, the collectives'
buffer layouts and expected values, and nccl-tests' bandwidth arithmetic."""

from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

import numpy as np

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all")
SIZES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)
ELEM = 4  # float32
#: The sizes of ``--vs deepspeed``: 8 B and the powers of 4 from 16 B to 16 MiB.
DEEPSPEED_SIZES = (8,) + tuple(16 << (2 * k) for k in range(11))
#: The element types a run can time (``--dtypes``, with ``--vs deepspeed``), and their bytes.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: How reports and plots name the peers.
LABELS = {"rustdist": "rustdist", "gloo": "gloo", "mpi": "Open MPI", "torch_nccl": "torch NCCL",
          "deepspeed": "DeepSpeed shm", "rustdist-torch": "rustdist torch door",
          "rustdist-swap": "rustdist import swap"}
#: Ops whose tensors hold one chunk per rank (the size is the whole, chunk * world).
CHUNKED = ("all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Config:
    """What every rank of one world runs (written by the launcher as JSON, read by ranks)."""

    mode: str  # "compare" (CPU, vs gloo and maybe MPI), "deepspeed", "cuda", "soak", "recovery"
    world: int
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    rounds: int
    round_seconds: float
    max_iters: int
    mpi: bool
    master_addr: str
    master_port: int
    soak_ops: int
    bind: bool  # bind each rank to one core where the world has more ranks than cores
    dtypes: tuple[str, ...] = ("float32",)  # the element types of the cases, in this order
    deepspeed: tuple[str, ...] = ()  # the dtypes DeepSpeed's shared-memory op runs (its side)

    def to_json(self) -> str:
        """The config as JSON text."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Config:
        """The config `to_json` wrote."""
        d = json.loads(text)
        return cls(**{**d, **{k: tuple(d[k]) for k in ("ops", "sizes", "dtypes", "deepspeed")}})


def round_plan(quick: bool) -> tuple[int, float]:
    """Rounds per case and the target seconds of one side's round (``--quick``: fewer,
    shorter)."""
    return (5, 0.01) if quick else (15, 0.03)


def write_json(path: str, doc: dict[str, Any]) -> None:
    """Writes a run's results to `path` and says so."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"results written to {path}")


def bound_core(rank: int, world: int, cpus: Sequence[int]) -> Optional[int]:
    """The core rank `rank` of a `world` runs on when bound: the ``rank % len(cpus)``-th of
    `cpus` in ascending order where there are more ranks than `cpus`, else None (the scheduler keeps one rank per core
    by itself). With more ranks than cores the scheduler packs them unevenly for seconds at a
    time (3 ranks on one core of 2 and 1 on the other makes a collective 1.5x slower), so
    unbound rounds of two peers can see different packings; bound, every peer sees the same."""
    if not cpus or world <= len(cpus):
        return None
    return sorted(cpus)[rank % len(cpus)]


@dataclass(frozen=True)
class Layout:
    """Element counts of one (op, size, world): each rank's input and output, and the chunk
    each rank contributes or receives (all_gather, reduce_scatter, all_to_all)."""

    op: str
    world: int
    chunk: int
    n_in: int
    n_out: int
    elem: int = ELEM  # bytes per element

    @property
    def nbytes(self) -> int:
        """The size as nccl-tests reports it (see the package docstring)."""
        return max(self.n_in, self.n_out) * self.elem


def layout(op: str, size: int, world: int, elem: int = ELEM) -> Layout:
    """The buffers of `op` at `size` bytes of `elem`-byte elements (rounded down to whole
    chunks, at least one element per rank)."""
    elems = max(1, size // elem)
    if op not in CHUNKED:
        return Layout(op, world, elems, elems, 0, elem)
    chunk = max(1, elems // world)
    whole = chunk * world
    n_in = chunk if op == "all_gather" else whole
    n_out = chunk if op == "reduce_scatter" else whole
    return Layout(op, world, chunk, n_in, n_out, elem)


def input_values(lay: Layout, rank: int) -> np.ndarray:
    """Rank `rank`'s input for the correctness check: values that make every rank's and every
    chunk's contribution visible in the result."""
    w, c = lay.world, lay.chunk
    if lay.op == "reduce_scatter":  # chunk j holds (rank + 1) * (j + 1)
        return np.repeat((rank + 1) * np.arange(1, w + 1, dtype=np.float32), c)
    if lay.op == "all_to_all":  # chunk j (for rank j) holds rank * w + j + 1
        return np.repeat(rank * w + np.arange(1, w + 1, dtype=np.float32), c)
    return np.full(lay.n_in, rank + 1, dtype=np.float32)


def expected(lay: Layout, rank: int) -> tuple[str, np.ndarray]:
    """Which buffer ("in" or "out") holds the result on rank `rank`, and its expected values."""
    w, c = lay.world, lay.chunk
    total = w * (w + 1) / 2  # sum of every rank's rank + 1
    if lay.op == "all_reduce":
        return "in", np.full(lay.n_in, total, dtype=np.float32)
    if lay.op == "broadcast":
        return "in", np.full(lay.n_in, 1, dtype=np.float32)
    if lay.op == "all_gather":
        return "out", np.repeat(np.arange(1, w + 1, dtype=np.float32), c)
    if lay.op == "reduce_scatter":
        return "out", np.full(c, (rank + 1) * total, dtype=np.float32)
    return "out", np.repeat(np.arange(w, dtype=np.float32) * w + rank + 1, c)


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests' bus bandwidth factor (busbw = algbw * factor)."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op == "broadcast":
        return 1.0
    return (world - 1) / world


def bandwidths(op: str, nbytes: int, world: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of one call of `op` on `nbytes` taking `seconds`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * busbw_factor(op, world)


def fmt_size(nbytes: int) -> str:
    """`67108864` as `64 MiB`, `4096` as `4 KiB`, `16` as `16 B`."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def parse_size(text: str) -> int:
    """`67108864`, `64M`, `64MiB`, `4k`, ... as bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    shift = {"k": 10, "m": 20, "g": 30}.get(t[-1:], 0)
    try:
        return int(t[:-1] if shift else t) << shift
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def machine() -> dict[str, Any]:
    """The CPU, cores and versions a result was measured with."""
    import torch

    from .. import __version__

    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rustdist": __version__,
        # Ranks inherit the environment: RUSTDIST_SHM=0 keeps them on TCP.
        "rustdist_links": "tcp" if os.environ.get("RUSTDIST_SHM") == "0" else "shm",
    }
