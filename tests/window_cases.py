"""Cases for tests/test_window.py: torch 2.14's one-sided windows (``_new_window``,
``Window.tensor_register``, ``put``, ``signal``, ``wait_signal``, ``map_remote_tensor``) on the
shared worlds, through the harness's door. Every case makes its windows and deregisters them
before it returns. Where every rank shares one host with shared memory, access is UNIFIED
(peers' tensors mapped here); where they do not (``RUSTDIST_SHM=0``, the test hosts) it is
SEPARATE (puts and signals carried on the links), and ``map_remote_tensor`` of a peer raises:
the cases check whichever the world has."""

from __future__ import annotations

import os
import time
import types
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from dist_cases import DTYPES, check, expect_raises, gen

#: Elements each rank's window holds: a block of BLOCK per source rank (worlds up to 4),
#: offset by one so that no put starts on element 0.
BLOCK = 5
NUMEL = 1 + 4 * BLOCK


def _separate(dist: Any, world: int) -> bool:
    """Whether this world's windows have SEPARATE access (its ranks do not all share one host
    with shared memory); every group answers ``_supports_window()`` True either way."""
    assert dist._supports_window()
    apart = os.environ.get("RUSTDIST_SHM") == "0" or bool(os.environ.get("RUSTDIST_TEST_HOSTS"))
    return world > 1 and apart


def _check_access(dist: Any, window: Any, rank: int, world: int) -> bool:
    """Checks every peer's access type (and, with SEPARATE, that mapping a peer's tensor
    raises naming it); returns whether access is SEPARATE."""
    separate = _separate(dist, world)
    for peer in range(world):
        unified = not separate or peer == rank
        assert window.get_attr(peer).access_type.name == ("UNIFIED" if unified else "SEPARATE")
        if not unified:
            expect_raises(RuntimeError, "SEPARATE", lambda: window.map_remote_tensor(peer),
                          f"mapping rank {peer}'s window from another host")
    return separate


def _data(dtype: torch.dtype, n: int, who: int, seed: int) -> torch.Tensor:
    """Full-range data of `who` (complex: pairs of float32)."""
    if dtype.is_complex:
        return torch.view_as_complex(gen("any", torch.float32, (n, 2), who, seed))
    return gen("any", dtype, (n,), who, seed)


def _source_block(dtype: torch.dtype, src: int, dst: int, seed: int) -> torch.Tensor:
    return _data(dtype, BLOCK, 10 * src + dst, seed)


def _expected(dtype: torch.dtype, owner: int, world: int, seed: int) -> torch.Tensor:
    """Rank `owner`'s window after every rank put its block there: its own start values,
    each source's block at 1 + source * BLOCK."""
    want = _data(dtype, NUMEL, owner, seed + 1)
    for src in range(world):
        want[1 + src * BLOCK:1 + (src + 1) * BLOCK] = _source_block(dtype, src, owner, seed)
    return want


def case_window_put_signal(dist: Any, rank: int, world: int, dtype: str, async_op: bool,
                           seed: int = 0) -> None:
    """Every rank puts a block into every rank's window (itself included) at its own offset,
    signals each, then waits for every rank's signal: each window holds exactly the blocks
    and the start values elsewhere; ``map_remote_tensor`` shows every peer's the same."""
    dt = DTYPES[dtype] if dtype in DTYPES else getattr(torch, dtype)
    mine = _data(dt, NUMEL, rank, seed + 1)
    window = dist._new_window(mine)
    sources = [_source_block(dt, rank, dst, seed) for dst in range(world)]
    works = [window.put(sources[dst], dst, 1 + rank * BLOCK, async_op) for dst in range(world)]
    works += [window.signal(dst, async_op) for dst in range(world)]
    works += [window.wait_signal(src, async_op) for src in range(world)]
    for work in works:
        work.wait()
    check(mine, _expected(dt, rank, world, seed), f"rank {rank}'s window after the puts")
    separate = _check_access(dist, window, rank, world)
    for peer in [rank] if separate else range(world):
        check(window.map_remote_tensor(peer), _expected(dt, peer, world, seed),
              f"rank {peer}'s window mapped on rank {rank}")
    dist.barrier()  # nobody deregisters while a peer still reads its window
    window.tensor_deregister()


def case_window_write_through_map(dist: Any, rank: int, world: int, dump_prefix: str) -> None:
    """A rank writes into the next rank's window (UNIFIED: through ``map_remote_tensor``;
    SEPARATE: by a put) and signals; the next rank sees the values in its tensor, and rounds
    repeat over one window (signals counted, not lost). The flight recorder lists the
    signals and waits with their peers."""
    import pickle

    from rustdist import flight_recorder

    window = dist._new_window()
    mine = torch.zeros(4, dtype=torch.int64)
    window.tensor_register(mine)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    separate = _check_access(dist, window, rank, world)
    remote = None if separate else window.map_remote_tensor(nxt)
    for round_ in range(50):
        value = 1000 * round_ + rank
        if remote is None:
            window.put(torch.tensor([value]), nxt, round_ % 4, False)
        else:
            remote[round_ % 4] = value
        window.signal(nxt, False)
        window.wait_signal(prv, False)
        assert int(mine[round_ % 4]) == 1000 * round_ + prv, (round_, mine)
    with open(flight_recorder.dump(dump_prefix), "rb") as f:
        names = [e["profiling_name"] for e in pickle.load(f)["entries"]]
    for op, pair in (("signal", f"{rank}->{nxt}"), ("wait_signal", f"{prv}->{rank}")):
        assert any(n.endswith(f":{op} {pair}") for n in names), (op, pair, names[-6:])
    dist.barrier()
    window.tensor_deregister()


def case_window_numpy(dist: Any, rank: int, world: int) -> None:
    """Numpy arrays on the import-swap door: puts land in the window, which the owner reads
    through ``map_remote_tensor(own rank)`` (an array cannot move into shared memory)."""
    mine = np.full(NUMEL, -1.0, dtype=np.float64)
    window = dist._new_window(mine)
    for dst in range(world):
        block = np.arange(BLOCK, dtype=np.float64) + 100 * rank + dst
        window.put(block, dst, 1 + rank * BLOCK, False)
        window.signal(dst, False)
    for src in range(world):
        window.wait_signal(src, False)
    got = window.map_remote_tensor(rank)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64, type(got)
    want = np.full(NUMEL, -1.0)
    for src in range(world):
        want[1 + src * BLOCK:1 + (src + 1) * BLOCK] = np.arange(BLOCK) + 100 * src + rank
    np.testing.assert_array_equal(got, want)
    dist.barrier()
    window.tensor_deregister()


def case_window_misuse(dist: Any, rank: int, world: int) -> None:
    """Bad calls raise, naming what is wrong, and write nothing: a put past the end, of the
    wrong dtype, to a rank out of range, before registering and after deregistering; a second
    registration; a wait for a signal that never comes times out."""
    window = dist._new_window()
    block = torch.ones(BLOCK)
    expect_raises(RuntimeError, "no tensor is registered", lambda: window.put(block, 0, 0, False),
                  "a put before tensor_register")
    mine = torch.zeros(NUMEL)
    window.tensor_register(mine)
    expect_raises(RuntimeError, "already registered", lambda: window.tensor_register(mine),
                  "a second tensor_register")
    expect_raises(ValueError, "does not fit", lambda: window.put(block, 0, NUMEL - 2, False),
                  "a put past the end of the window")
    expect_raises(ValueError, "does not fit", lambda: window.put(block, 0, -1, False),
                  "a put at a negative offset")
    expect_raises(TypeError, "dtypes must match",
                  lambda: window.put(block.double(), 0, 0, False), "a put of another dtype")
    expect_raises(ValueError, "out of range", lambda: window.put(block, world, 0, False),
                  "a put to a rank out of range")
    expect_raises(ValueError, "out of range", lambda: window.signal(-1, False),
                  "a signal to a rank out of range")
    opts = types.SimpleNamespace(timeout=timedelta(milliseconds=200), hints={})
    expect_raises(Exception, "timed out", lambda: window.wait_signal(0, False, opts),
                  "a wait for a signal nobody sent")
    dist.barrier()
    check(mine, torch.zeros(NUMEL), "a window no valid put reached")
    window.tensor_deregister()
    expect_raises(RuntimeError, "no tensor is registered", lambda: window.put(block, 0, 0, False),
                  "a put after tensor_deregister")


def case_window_idle_target(dist: Any, rank: int, world: int, store_path: str) -> None:
    """Rank 1's program calls nothing rustdist while rank 0 puts 32 MiB into its window (far
    more than the links buffer, in 1 MiB puts) and signals: the puts complete on rank 0 all the
    same (rank 1's engine applies them meanwhile), and rank 1 then finds every byte. The
    ranks meet through a file store, not the group."""
    store = dist.FileStore(store_path, world)
    n, chunk = 32 << 20, 1 << 20
    mine = torch.zeros(n, dtype=torch.uint8)
    window = dist._new_window(mine)
    pattern = (torch.arange(n) % 251).to(torch.uint8)
    if rank == 0:
        for off in range(0, n, chunk):
            window.put(pattern[off:off + chunk], 1, off, False)
        window.signal(1, False)
        store.set("puts_done", "1")
    elif rank == 1:
        store.wait(["puts_done"])  # no call into the group until rank 0's puts completed
        window.wait_signal(0, False)
        check(mine, pattern, "rank 1's window after rank 0's puts")
    dist.barrier()
    window.tensor_deregister()


def case_window_lone_put(dist: Any, rank: int, world: int, store_path: str) -> None:
    """A small put that no signal follows still lands: rank 0 puts 8 values into rank 1's
    window and then calls nothing rustdist; rank 1, calling nothing either, watches its own
    tensor until they are there (on TCP a small synchronous put is queued to leave with the
    frame after it; with none, the engine sends it in its next round)."""
    store = dist.FileStore(store_path, world)
    mine = torch.zeros(NUMEL)
    window = dist._new_window(mine)
    block = torch.arange(1, 9, dtype=torch.float32)
    if rank == 0:
        window.put(block, 1, 3, False)
        store.set("put_done", "1")
        store.wait(["seen"])  # no call into the group until rank 1 saw the values
    elif rank == 1:
        store.wait(["put_done"])
        deadline = time.monotonic() + 10
        while not torch.equal(mine[3:11], block) and time.monotonic() < deadline:
            pass
        check(mine[3:11], block, "rank 1's window, 10 s after rank 0's lone put")
        store.set("seen", "1")
    dist.barrier()
    window.tensor_deregister()


def case_window_deregister_then_leave(dist: Any, rank: int, world: int, rounds: int) -> None:
    """`rounds` times, on a new group: every rank puts 1 MiB into the next rank's window
    asynchronously and, without waiting, deregisters and destroys the group, as a program's
    last lines do. Each deregister completes (a peer that closed and left is no longer needed)
    and each window then holds the previous rank's bytes (a put issued before its rank's
    deregister lands)."""
    n = 1 << 20
    for r in range(rounds):
        group = dist.new_group(list(range(world)))
        mine = torch.zeros(n, dtype=torch.uint8)
        window = dist._new_window(mine, group=group)
        block = ((torch.arange(n) + rank + r) % 251).to(torch.uint8)
        work = window.put(block, (rank + 1) % world, 0, True)
        window.tensor_deregister()
        work.wait()
        dist.destroy_process_group(group)
        want = ((torch.arange(n) + (rank - 1) % world + r) % 251).to(torch.uint8)
        check(mine, want, f"round {r}: rank {rank}'s window after deregister")
    dist.barrier()


def _resources() -> tuple[int, int, int]:
    shm = len([n for n in os.listdir("/dev/shm") if n.startswith(f"rustdist-w-{os.getpid()}-")])
    return shm, len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def case_window_churn(dist: Any, rank: int, world: int, windows: int) -> dict[str, Any]:
    """`windows` windows made, used and deregistered in turn: this process's /dev/shm
    entries, fds and threads after the last equal those after the first."""
    seen = []
    for i in range(windows):
        mine = torch.zeros(64, dtype=torch.int32)
        window = dist._new_window(mine)
        window.put(torch.full((1,), i, dtype=torch.int32), (rank + 1) % world, rank, False)
        window.signal((rank + 1) % world, False)
        window.wait_signal((rank - 1) % world, False)
        assert int(mine[(rank - 1) % world]) == i, (i, mine)
        window.tensor_deregister()
        del window, mine
        if i in (0, windows - 1):
            seen.append(_resources())
    assert seen[0] == seen[1], f"after window 1 and window {windows}: {seen}"
    return {"shm_fds_threads": seen[1]}


def case_window_dead_peer(dist: Any, rank: int, world: int, victim: int) -> str:
    """Rank `victim` exits once the window is made; every other rank waits for its signal
    and must get an error naming it (within the group's timeout, not hang)."""
    window = dist._new_window(torch.zeros(4))
    if rank == victim:
        os._exit(1)
    error = expect_raises(Exception, "", lambda: window.wait_signal(victim, False),
                          "a wait for a dead peer's signal")
    assert f"rank {victim}" in str(error) or f"{victim}" in str(error), error
    return str(error)


def case_window_after_destroy(dist: Any, rank: int, world: int) -> None:
    """A window outlives its group only as memory: after ``destroy_process_group`` every
    operation raises saying the group was destroyed."""
    window = dist._new_window(torch.zeros(8))
    dist.destroy_process_group()
    for what, call in (("put", lambda: window.put(torch.ones(2), 0, 0, False)),
                       ("signal", lambda: window.signal(0, False)),
                       ("wait_signal", lambda: window.wait_signal(0, False))):
        expect_raises(Exception, "destroyed", call, f"a {what} after destroy_process_group")
