"""How long ``python -m rustdist.status`` takes to answer about a running job of W ranks.

    python tools/status_query_time.py --world 64 [--queries 5]

Starts W numpy-only rank processes on 127.0.0.1 (rustdist's import-swap door, torch made
unimportable: about 35 MB each). Every rank but 0 enters an all_reduce; rank 0 "computes"
(waits for a key in the job's store) until the measurement is done. Once the query says that
every other rank waits for rank 0, it times ``rustdist.status.query`` (the store read and the
UDP round to every rank; what the command does after Python and its imports have started)
``--queries`` times, then the whole command once (a fresh interpreter that imports rustdist,
and torch where it is installed). Prints JSON: the world, every query's seconds, the command's,
and whether each query had every rank's answer and the right verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

from rustdist import TCPStore, status
from rustdist.bench import scale_rank
from rustdist.bench.launch import free_port

DONE = "status-query-time/done"

RANK = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(scale_rank.__file__))!r})
import scale_rank
scale_rank.hide_torch()
sys.path.pop(0)
import os
from datetime import timedelta
import numpy as np
import rustdist as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=300))
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 0:
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), None, False,
                          timedelta(seconds=300))
    store.wait([{DONE!r}])
x = np.ones(2, np.float32)
dist.all_reduce(x)
assert x.tolist() == [world] * 2, x
dist.destroy_process_group()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=64)
    p.add_argument("--queries", type=int, default=5)
    args = p.parse_args()
    port = free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(args.world), "RUSTDIST_SHM": "0", "RUSTDIST_LOG_LEVEL": "off"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(r)})
             for r in range(args.world)]
    address = f"127.0.0.1:{port}"
    try:
        store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=300))
        store.wait([f"{status.KEY_PREFIX}{r}" for r in range(args.world)])
        deadline = time.monotonic() + 120
        while True:  # until every other rank waits in the all_reduce (a condition, bounded)
            ranks = status.query(address)
            if all(r["waits_for"] == [0] for r in ranks[1:]) or time.monotonic() > deadline:
                break
        times, complete = [], []
        for _ in range(args.queries):
            start = time.perf_counter()
            ranks = status.query(address)
            times.append(time.perf_counter() - start)
            complete.append(all(r["alive"] for r in ranks)
                            and all(r["waits_for"] == [0] for r in ranks[1:]))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rustdist.status", address], check=True,
                       capture_output=True, timeout=120)
        command = time.perf_counter() - start
        store.set(DONE, "1")
        failed = [r for r, proc in enumerate(procs) if proc.wait(timeout=120) != 0]
    finally:
        for proc in procs:
            proc.kill()
    print(json.dumps({"world": args.world, "query_s": times, "every_rank_answered": complete,
                      "command_s": command, "ranks_failed": failed}))
    return 0 if all(complete) and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
