"""A job that hangs, and what rustdist says about it: one rank skips an all_reduce and goes
into a barrier of its tensor-parallel pair instead, as a rank stuck on another code path does.

    python examples/hang.py --world 4 --dump-dir /tmp/fr
    python -m torch.distributed.flight_recorder.fr_trace /tmp/fr --prefix rank_
    python -m rustdist.flight_recorder /tmp/fr

Every waiting rank's exception names the rank that never arrived and what it was doing
instead (learnt from its heartbeats), and every rank writes its flight recorder dump into
``--dump-dir``, which torch's analyzer (``fr_trace``) and rustdist's timeline read. See
docs/flight-recorder.md.
"""

import argparse
import os
from datetime import timedelta

import torch

import rustdist as dist
from launch import run

TIMEOUT = timedelta(seconds=5)


def main(args: argparse.Namespace) -> None:
    os.makedirs(args.dump_dir, exist_ok=True)
    os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(args.dump_dir, "rank_")
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Tensor-parallel pairs (0, 1), (2, 3), ...: every rank creates every group, as torch asks.
    pairs = [dist.new_group(list(range(r, min(r + 2, world))), timeout=TIMEOUT,
                            group_desc=f"tp:{r // 2}") for r in range(0, world, 2)]
    culprit = 2 if world > 2 else world - 1
    grad = torch.ones(1024)
    try:
        for step in range(5):
            if step == 3 and rank == culprit:
                dist.barrier(group=pairs[rank // 2])  # the all_reduce the others wait in
                continue
            dist.all_reduce(grad)
    except dist.DistError as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    run(main, "a rank skips an all_reduce; the others time out and name it",
        lambda parser: parser.add_argument(
            "--dump-dir", default="/tmp/rustdist-hang",
            help="where each rank writes its flight recorder dump (rank_<rank>)"))
