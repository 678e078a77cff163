"""One rank for tests/test_interrupt.py: blocks in a rustdist call until the driver sends
SIGINT, then checks what Ctrl-C leaves behind.

    python interrupt_prog.py MODE DOOR RANK PORT

MODE is ``collective`` (world 2: rank 0 blocks in all_reduce, rank 1 never joins it and
waits for stdin to close), ``store_get`` (a TCPStore get of a key nobody sets) or ``init``
(rank 0 of a world of 2 whose rank 1 never comes). DOOR is ``rustdist`` (import rustdist as
dist) or ``torch`` (torch.distributed with backend "rustdist"). Rank 0 prints ``blocking``
before the call, ``caught <time.monotonic()>`` when KeyboardInterrupt arrives, and
``after ok`` once the aftermath checks passed.
"""

import os
import sys
import time
from datetime import timedelta

import torch

import rustdist

MODE, DOOR, RANK, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist = rustdist if DOOR == "rustdist" else torch.distributed
TIMEOUT = timedelta(seconds=60)


def say(*words: object) -> None:
    print(*words, flush=True)


def blocked(call) -> None:
    """Runs `call`, which must block until SIGINT raises KeyboardInterrupt in it."""
    say("blocking")
    try:
        call()
    except KeyboardInterrupt:
        say("caught", time.monotonic())
        return
    raise AssertionError("the call returned instead of blocking")


def fresh_world_works() -> None:
    """A new init (a world of 1) works and runs a collective."""
    dist.init_process_group("rustdist", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=TIMEOUT)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0], t
    dist.destroy_process_group()


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(PORT))
    if MODE == "collective":
        dist.init_process_group("rustdist", init_method="env://", rank=RANK, world_size=2,
                                timeout=TIMEOUT)
        if RANK == 1:
            sys.stdin.read()  # the driver closes stdin once rank 0 is done
            os._exit(0)
        blocked(lambda: dist.all_reduce(torch.ones(4)))
        try:
            dist.all_reduce(torch.ones(2))
        except rustdist.DistBackendError as e:
            assert "aborted" in str(e) and "interrupted" in str(e), e
        else:
            raise AssertionError("a collective after the interrupt succeeded")
        dist.destroy_process_group()
        fresh_world_works()
    elif MODE == "store_get":
        store = rustdist.TCPStore("127.0.0.1", PORT, 1, True, timeout=TIMEOUT)
        blocked(lambda: store.get("never-set"))
        store.set("k", "v")
        assert store.get("k") == b"v"
    elif MODE == "init":
        blocked(lambda: dist.init_process_group(
            "rustdist", init_method=f"tcp://127.0.0.1:{PORT}", rank=0, world_size=2,
            timeout=TIMEOUT))
        assert not dist.is_initialized()
        fresh_world_works()
    else:
        raise ValueError(MODE)
    say("after ok")


if __name__ == "__main__":
    main()
