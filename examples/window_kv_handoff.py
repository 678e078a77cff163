"""A KV-cache handoff over a one-sided window: prefill ranks write blocks straight into their
decode rank's window and signal; decode ranks consume each block in place and hand its slot
back with a signal. No matched send/recv, no copy through a staging slot.

    torchrun --nproc-per-node 2 examples/window_kv_handoff.py [--blocks N] [--block-kib K]
    torchrun --nproc-per-node 2 examples/window_kv_handoff.py --torch-door   # torch 2.14+

Ranks pair up: each even rank (prefill) feeds the next odd rank (decode). The decode rank's
window holds ``--slots`` blocks; the prefill rank puts block i into slot i % slots once the
decode rank has signalled that slot free. Every block is checked element by element, and
the decode rank prints the handoff rate. On one host the window is shared memory (UNIFIED
access); across hosts, or with RUSTDIST_SHM=0, the puts travel on the links (SEPARATE). With ``--torch-door`` the program uses torch.distributed's own ``_new_window`` on the
"rustdist" backend; by default it swaps the import (``import rustdist as dist``).
"""

import argparse
import sys
import time

import torch


#: Distinct block contents, reused in turn: a slot refilled too early, or not at all, holds
#: the wrong pattern (PATTERNS is prime, so no slot count lines up with it).
PATTERNS = 17


def block_patterns(elems: int) -> list[torch.Tensor]:
    """The contents of block i are ``patterns[i % PATTERNS]`` (exact in float16)."""
    base = torch.arange(elems, dtype=torch.float32).remainder_(1024)
    return [(base + p).to(torch.float16) for p in range(PATTERNS)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=2000)
    parser.add_argument("--block-kib", type=int, default=256)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--torch-door", action="store_true",
                        help="torch.distributed on the rustdist backend (torch 2.14+)")
    args = parser.parse_args()
    if args.torch_door:
        import torch.distributed as dist

        import rustdist  # noqa: F401 - registers the "rustdist" backend
    else:
        import rustdist as dist
    dist.init_process_group("rustdist")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % 2:
        sys.exit("window_kv_handoff: run an even number of ranks (prefill, decode pairs)")
    elems = args.block_kib * 1024 // 2
    patterns = block_patterns(elems)
    prefill = rank % 2 == 0
    peer = rank + 1 if prefill else rank - 1
    # Collective: every rank registers its own memory; only decode ranks receive blocks.
    mine = torch.zeros(1 if prefill else args.slots * elems, dtype=torch.float16)
    window = dist._new_window(mine)
    dist.barrier()
    start = time.perf_counter()
    if prefill:
        for i in range(args.blocks):
            if i >= args.slots:
                window.wait_signal(peer, False)  # the decode rank freed slot i % slots
            window.put(patterns[i % PATTERNS], peer, (i % args.slots) * elems, False)
            window.signal(peer, False)
    else:
        for i in range(args.blocks):
            window.wait_signal(peer, False)
            slot = mine[(i % args.slots) * elems:(i % args.slots + 1) * elems]
            if not torch.equal(slot, patterns[i % PATTERNS]):
                sys.exit(f"rank {rank}: block {i} arrived corrupted")
            if i + args.slots < args.blocks:
                window.signal(peer, False)  # slot i % slots is free again
        seconds = time.perf_counter() - start
        moved = args.blocks * elems * 2
        print(f"rank {rank}: {args.blocks} blocks of {args.block_kib} KiB from rank {peer} "
              f"checked in {seconds:.3f} s: {moved / seconds / 1e9:.2f} GB/s, "
              f"{args.blocks / seconds:,.0f} blocks/s", flush=True)
    dist.barrier()
    window.tensor_deregister()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
