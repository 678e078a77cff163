"""One rank of tests/test_memory.py: N all_gather_into_tensor calls, each into a fresh 1 MiB
output dropped at once (as FSDP's parameter gathers do), then reports its memory.

    python memory_prog.py DOOR ITERATIONS OUT_JSON   (MASTER_ADDR/PORT, RANK, WORLD_SIZE set)

DOOR: ``gloo`` (torch.distributed on gloo), ``torch`` (torch.distributed on the "rustdist"
backend) or ``rustdist`` (``import rustdist as dist``)."""

import json
import resource
import sys

import torch

DOOR, ITERATIONS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
OUTPUT_BYTES = 1 << 20


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    if DOOR == "rustdist":
        import rustdist as dist
    else:
        import torch.distributed as dist

        if DOOR == "torch":
            import rustdist  # noqa: F401 - registers the backend
    dist.init_process_group("gloo" if DOOR == "gloo" else "rustdist")
    world = dist.get_world_size()
    inp = torch.full((OUTPUT_BYTES // 4 // world,), float(dist.get_rank()))
    for i in range(ITERATIONS + 100):
        if i == 100:  # after warm-up: caches, pools and lazily created state exist
            before = rss_mib()
        out = torch.empty(inp.numel() * world)
        dist.all_gather_into_tensor(out, inp)
        del out
    after = rss_mib()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dist.destroy_process_group()
    with open(OUT, "w") as f:
        json.dump({"before": before, "after": after, "peak": peak}, f)


if __name__ == "__main__":
    main()
