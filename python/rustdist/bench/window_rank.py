"""One rank of ``python -m rustdist.bench --window``, started by ``mpirun`` (its rank from
OMPI_COMM_WORLD_RANK): it joins rustdist's world and Open MPI's, and times, in the same
processes and interleaved, one-sided puts through a rustdist window and through an MPI window
(``MPI.Win.Allocate``, passive target: ``Lock_all``, ``Put``, ``Flush``), and a put+signal
round trip beside rustdist's matched send/recv. Ranks pair up (r with r ^ 1), every pair at
once; the even rank of a pair is the origin. The slowest pair's median over the repeats is
reported; rank 0 writes the results to the JSON file it was given.

Where the window's access is SEPARATE (``RUSTDIST_SHM=0``, or the ranks on different hosts;
Open MPI on its TCP transport) a rustdist put completes when its bytes have left the origin,
while ``Flush`` waits until they are at the target: so there each rustdist put (or burst) is
followed by a signal that the target answers with one, and the time includes that round trip
(remote completion at the origin, as ``Flush`` gives).

    mpirun -np W python -m rustdist.bench.window_rank OUT.json [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

#: Put latency: one put and its completion, origin side (8 B - 64 KiB).
LATENCY_SIZES = [8, 64, 512, 4096, 32768, 65536]
#: Put bandwidth: puts back to back, then one completion (64 KiB - 64 MiB).
BANDWIDTH_SIZES = [65536, 1 << 20, 8 << 20, 64 << 20]
#: Put+signal round trips beside send/recv ping-pongs.
ROUND_TRIP_SIZES = [8, 512, 4096, 65536, 1 << 20, 8 << 20]
WINDOW_BYTES = max(BANDWIDTH_SIZES)


def _iters(nbytes: int, quick: bool, budget: int) -> int:
    """Calls per timed repeat: enough bytes to time, capped for small sizes."""
    n = max(4, min(2000, budget // max(nbytes, 1)))
    return max(4, n // 4) if quick else n


class Pair:
    """This rank's partner and both libraries' windows of WINDOW_BYTES bytes."""

    def __init__(self, rd: Any, MPI: Any) -> None:
        self.rd, self.MPI, self.comm = rd, MPI, MPI.COMM_WORLD
        self.rank, self.world = rd.get_rank(), rd.get_world_size()
        self.peer = self.rank ^ 1
        self.origin = self.rank % 2 == 0
        self.active = self.peer < self.world
        self.src = np.arange(WINDOW_BYTES, dtype=np.uint64).astype(np.uint8)
        self.rd_mem = np.zeros(WINDOW_BYTES, dtype=np.uint8)
        self.rd_win = rd._new_window(self.rd_mem)
        # Puts carried on the links complete at the origin before they land: see above.
        self.acked = (self.active
                      and self.rd_win.get_attr(self.peer).access_type.name == "SEPARATE")
        self.mpi_win = MPI.Win.Allocate(WINDOW_BYTES, 1, comm=self.comm)
        self.mpi_win.Lock_all()

    def close(self) -> None:
        self.mpi_win.Unlock_all()
        self.mpi_win.Free()
        self.rd.barrier()
        self.rd_win.tensor_deregister()

    def timed(self, fns: tuple[Callable[[], None], ...], iters: int, repeats: int
              ) -> list[float]:
        """Median seconds per call of each of `fns` over `repeats` (every rank times the same
        number of calls; the slowest pair counts). The repeats of the sides alternate, so
        that noise lasting longer than a repeat (other work on shared cores) falls on both."""
        times: list[list[float]] = [[] for _ in fns]
        for _ in range(repeats):
            for fn, mine in zip(fns, times):
                self.comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                elapsed = (time.perf_counter() - t0) / iters
                mine.append(self.comm.allreduce(elapsed, op=self.MPI.MAX))
        return [statistics.median(mine) for mine in times]

    # -- the calls each measurement repeats ------------------------------------------------

    def rd_put(self, n: int) -> Callable[[], None]:
        return self.rd_burst(n, 1)

    def _ack(self) -> Callable[[], None]:
        """The target's side of an acknowledged put: wait for the signal, answer it."""
        win, peer = self.rd_win, self.peer

        def call() -> None:
            win.wait_signal(peer, False)
            win.signal(peer, False)
        return call

    def mpi_put(self, n: int) -> Callable[[], None]:
        if not (self.active and self.origin):
            return lambda: None
        buf, win, peer = self.src[:n], self.mpi_win, self.peer

        def call() -> None:
            win.Put(buf, peer)
            win.Flush(peer)
        return call

    def rd_burst(self, n: int, count: int) -> Callable[[], None]:
        """`count` puts back to back (on shared memory each is complete on return: a copy into
        the peer; on TCP the last is acknowledged)."""
        if not self.active or (not self.origin and not self.acked):
            return lambda: None
        if not self.origin:
            return self._ack()
        buf, win, peer, acked = self.src[:n], self.rd_win, self.peer, self.acked

        def call() -> None:
            for _ in range(count):
                win.put(buf, peer, 0, False)
            if acked:
                win.signal(peer, False)
                win.wait_signal(peer, False)
        return call

    def mpi_burst(self, n: int, count: int) -> Callable[[], None]:
        if not (self.active and self.origin):
            return lambda: None
        buf, win, peer = self.src[:n], self.mpi_win, self.peer

        def call() -> None:
            for _ in range(count):
                win.Put(buf, peer)
            win.Flush(peer)
        return call

    def rd_put_signal_round_trip(self, n: int) -> Callable[[], None]:
        if not self.active:
            return lambda: None
        buf, win, peer = self.src[:n], self.rd_win, self.peer
        if self.origin:
            def call() -> None:
                win.put(buf, peer, 0, False)
                win.signal(peer, False)
                win.wait_signal(peer, False)
        else:
            def call() -> None:
                win.wait_signal(peer, False)
                win.put(buf, peer, 0, False)
                win.signal(peer, False)
        return call

    def rd_send_recv_round_trip(self, n: int) -> Callable[[], None]:
        if not self.active:
            return lambda: None
        rd, buf, peer = self.rd, self.src[:n], self.peer
        into = np.empty(n, dtype=np.uint8)
        if self.origin:
            def call() -> None:
                rd.send(buf, peer)
                rd.recv(into, peer)
        else:
            def call() -> None:
                rd.recv(into, peer)
                rd.send(buf, peer)
        return call


def main() -> None:
    out, quick = sys.argv[1], "--quick" in sys.argv[2:]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    from mpi4py import MPI  # MPI_Init before rustdist starts threads

    import rustdist as rd

    rd.init_process_group("rustdist", init_method="env://")
    pair = Pair(rd, MPI)
    repeats = 3 if quick else 5
    rows: dict[str, list[dict[str, Any]]] = {"latency": [], "bandwidth": [], "round_trip": []}
    for n in LATENCY_SIZES:
        iters = _iters(n, quick, 64 << 20)
        ours, mpi = pair.timed((pair.rd_put(n), pair.mpi_put(n)), iters, repeats)
        rows["latency"].append({"bytes": n, "rustdist_us": ours * 1e6, "mpi_us": mpi * 1e6})
    for n in BANDWIDTH_SIZES:
        count = _iters(n, quick, 256 << 20)
        ours, mpi = pair.timed((pair.rd_burst(n, count), pair.mpi_burst(n, count)), 1, repeats)
        rows["bandwidth"].append({"bytes": n, "rustdist_gbps": n * count / ours / 1e9,
                                  "mpi_gbps": n * count / mpi / 1e9})
    for n in ROUND_TRIP_SIZES:
        iters = _iters(n, quick, 32 << 20) // 2 + 2
        signalled, matched = pair.timed(
            (pair.rd_put_signal_round_trip(n), pair.rd_send_recv_round_trip(n)), iters, repeats)
        rows["round_trip"].append({"bytes": n, "put_signal_us": signalled * 1e6,
                                   "send_recv_us": matched * 1e6})
    pair.close()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"world": world, "mpi": MPI.Get_library_version().strip("\x00 \n")
                       .splitlines()[0], "quick": quick, **rows}, f, indent=1)
    rd.destroy_process_group()


if __name__ == "__main__":
    main()
