"""Where a CUDA call's time goes at world 1: rustdist's API, its CUDA layer and its engine
against torch's ProcessGroupNCCL, per call, for 8 B and 4 KiB float32 tensors.

Needs a GPU and the wheel installed: ``python tools/cuda_call_costs.py``. Prints the best and
the median of seven rounds of 3000 calls (``torch.cuda.synchronize()`` around each round).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as td

import rustdist as rd
import rustdist.cuda as rcuda
from rustdist import _world
from rustdist.bench.launch import free_port

SUM = 0


def per_call_us(fn: Callable[[], Any], calls: int = 3000, rounds: int = 7) -> tuple[float, float]:
    """(best, median) over ``rounds`` of the mean time of ``calls`` calls of ``fn``."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times), statistics.median(times)


def main() -> None:
    torch.cuda.set_device(0)
    rd.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                          world_size=1)
    nccl = td.new_group(backend="nccl")
    group = _world._default()
    for nbytes in (8, 4096):
        n = nbytes // 4
        inp = torch.randn(n, device="cuda")
        out = torch.empty_like(inp)
        rd.all_to_all_single(out, inp)
        assert torch.equal(out, inp)
        engine = rcuda._cuda_group(group, 0)
        stream = rcuda._current_stream(0)
        src, dst = inp.data_ptr(), out.data_ptr()
        code = rcuda._buffer(inp, "input")[2]
        keep = (out, inp)
        rows: dict[str, Callable[[], Any]] = {
            "rustdist all_to_all_single": lambda: rd.all_to_all_single(out, inp),
            "torch NCCL all_to_all_single": lambda: td.all_to_all_single(out, inp, group=nccl),
            "rustdist all_reduce": lambda: rd.all_reduce(out),
            "torch NCCL all_reduce": lambda: td.all_reduce(out, group=nccl),
            "rustdist all_gather_into_tensor": lambda: rd.all_gather_into_tensor(out, inp),
            "torch NCCL all_gather_into_tensor":
                lambda: td.all_gather_into_tensor(out, inp, group=nccl),
            "rustdist.cuda.all_to_all_single": lambda: rcuda.all_to_all_single(group, out, inp),
            "engine exchange, per-rank lists": lambda: engine.exchange(
                "all_to_all", code, 0, [(0, src, n)], [(0, dst, n)], stream, keep).wait(stream),
            "engine exchange, one buffer a side": lambda: engine.exchange(
                "all_to_all", code, n, src, dst, stream, keep).wait(stream),
            "engine all_reduce": lambda: engine.all_reduce(
                dst, n, code, SUM, stream, (out,), None).wait(stream),
            "torch out.copy_(inp)": lambda: out.copy_(inp),
        }
        print(f"--- {nbytes} B, world 1: best / median us per call")
        for name, fn in rows.items():
            best, median = per_call_us(fn)
            print(f"{name:36s} {best:7.2f} {median:7.2f}")
    rd.destroy_process_group()


if __name__ == "__main__":
    main()
