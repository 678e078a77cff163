"""One rank of ``--train``: a training step of a small transformer under DDP or FSDP2 on one
side (gloo, rustdist through torch's door, rustdist through the import swap), timed phase by
phase, with the two halves of its floor: the step's compute alone, and the step's collectives
alone. Run by ``train.py`` as ``python -m rustdist.bench.train_rank CONFIG.json RANK``; writes
``rank<r>.json`` next to the config.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch import nn


class Net(nn.Module):
    """A transformer encoder with token embeddings and an output layer over the vocabulary
    (at the defaults about the size of GPT-2 small's body: 55 M parameters)."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                       batch_first=True) for _ in range(layers))
        self.out = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def _init(side: str, cfg: dict[str, Any], rank: int) -> Any:
    """Joins the world on ``side``; returns the module whose collectives the side uses."""
    url = f"tcp://127.0.0.1:{cfg['port']}"
    world = cfg["world"]
    if side == "rustdist-swap":
        import rustdist as dist  # the import swap: the program says "gloo"

        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
        return dist
    import torch.distributed as dist

    if side == "rustdist":
        import rustdist  # noqa: F401 - registers backend "rustdist"
    dist.init_process_group(side, init_method=url, rank=rank, world_size=world)
    return dist


def _thread_cpu_ms() -> dict[int, float]:
    """CPU time (ms) each thread of this process has run, by thread id (the kernel's
    scheduler statistics: nanoseconds, unlike the 10 ms ticks of ``stat``)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e6
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def _rounds(parts: dict[str, Callable[[], dict[str, float]]], warmup: int, steps: int,
            barrier: Callable[[], None]) -> dict[str, list[dict[str, float]]]:
    """Runs the ``parts`` in turn, ``steps`` rounds after ``warmup``, each part started with
    the ranks lined up: a part's samples see the same machine as the others' in its round
    (on a shared host the speed drifts by tens of percent within a minute). Each sample holds
    the part's phases (ms) and the CPU time this process's threads ran during it, the calling
    thread's (``cpu_main``) apart from the others' (``cpu_others``: the engine's, or gloo's)."""
    main = threading.get_native_id()
    for _ in range(warmup):
        for fn in parts.values():
            barrier()
            fn()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in parts}
    for _ in range(steps):
        for name, fn in parts.items():
            barrier()
            before, main_before = _thread_cpu_ms(), time.thread_time()
            sample = fn()
            after, main_after = _thread_cpu_ms(), time.thread_time()
            # The calling thread's own clock: the statistics of a running thread lag by a tick.
            sample["cpu_main"] = (main_after - main_before) * 1e3
            sample["cpu_others"] = sum(ms - before.get(t, 0.0) for t, ms in after.items()
                                       if t != main)
            samples[name].append(sample)
    return samples


def _step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor,
          target: torch.Tensor, context: Callable[[], Any] = nullcontext) -> dict[str, float]:
    """One training step, each phase timed (ms)."""
    t0 = time.perf_counter()
    with context():
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
        t1 = time.perf_counter()
        loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    return {"forward": (t1 - t0) * 1e3, "backward": (t2 - t1) * 1e3,
            "optimizer": (t3 - t2) * 1e3, "step": (t3 - t0) * 1e3}


def _copies_ms(fn: Callable[[], Any]) -> float:
    """CPU time (ms) of one call of ``fn`` spent in tensor copies and in-place scaling
    (``aten::copy_``, ``aten::div_``, ``aten::mul_``, ``aten::mul``: a DDP bucket's copies and
    its division by the world size; FSDP2's copy-in and copy-out), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    # The profiler's library (kineto) logs its start and stop on stderr whatever its level.
    saved = os.dup(2)
    with open(os.devnull, "w", encoding="utf-8") as quiet:
        os.dup2(quiet.fileno(), 2)
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return sum(e.self_cpu_time_total for e in prof.key_averages()
               if e.key in COPY_OPS) / 1e3


#: The profiler's names of the ops :func:`_copies_ms` counts.
COPY_OPS = ("aten::copy_", "aten::div_", "aten::mul_", "aten::mul")


def _alone(dist: Any, calls: list[tuple[str, int, int, str]]) -> Callable[[], dict[str, float]]:
    """A part that runs ``calls`` on their own back to back, issued asynchronously in order
    and then waited for, as the step issues them. The tensors are made once, here."""
    tensors = []
    for op, out_n, in_n, dtype in calls:
        dt = getattr(torch, dtype.removeprefix("torch."))
        tensors.append((op, torch.ones(out_n, dtype=dt), torch.ones(in_n, dtype=dt)))

    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        works = []
        for op, out, inp in tensors:
            if op == "all_reduce":
                works.append(dist.all_reduce(out, async_op=True))
            elif op == "all_gather_into_tensor":
                works.append(dist.all_gather_into_tensor(out, inp, async_op=True))
            else:
                works.append(dist.reduce_scatter_tensor(out, inp, async_op=True))
        for w in works:
            w.wait()
        return {"step": (time.perf_counter() - t0) * 1e3}

    return run


def _ddp(dist: Any, cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(Net(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"]),
                gradient_as_bucket_view=cfg["bucket_view"])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(cfg["vocab"], (1, cfg["tokens"]), generator=gen)
    target = torch.randint(cfg["vocab"], (1, cfg["tokens"]), generator=gen)
    for _ in range(2):  # DDP rebuilds its buckets, in the order gradients come, after step 1
        _step(model, opt, tokens, target)
    logged = model._get_ddp_logging_data()
    sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", "")
    buckets = [int(s) for s in str(sizes).replace(",", " ").split()]
    calls = [("all_reduce", b // 4, b // 4, "torch.float32") for b in buckets]
    samples = _rounds({"step": lambda: _step(model, opt, tokens, target),
                       "compute": lambda: _step(model, opt, tokens, target, model.no_sync),
                       "alone": _alone(dist, calls)},
                      cfg["warmup"], cfg["steps"], dist.barrier)
    copies = _copies_ms(lambda: _step(model, opt, tokens, target))
    # The no_sync step's own copies and scalings (the model's), so that the step's excess
    # over them is DDP's: a gradient into its bucket and the reduced bucket back.
    compute_copies = _copies_ms(lambda: _step(model, opt, tokens, target, model.no_sync))
    return {"samples": samples, "buckets": buckets, "copies_ms": copies,
            "compute_copies_ms": compute_copies,
            "params": sum(p.numel() for p in model.parameters())}


def _fsdp2(dist: Any, cfg: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch.distributed as td
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from . import localcopy

    localcopy.register()
    copy_group = td.new_group(backend=localcopy.BACKEND)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
        if cfg["mixed"] else MixedPrecisionPolicy()
    gen = torch.Generator().manual_seed(rank)
    tokens = torch.randint(cfg["vocab"], (1, cfg["tokens"]), generator=gen)
    target = torch.randint(cfg["vocab"], (1, cfg["tokens"]), generator=gen)

    def sharded(group: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = Net(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"])
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model, torch.optim.SGD(model.parameters(), lr=1e-3)

    model, opt = sharded(td.group.WORLD)
    local, local_opt = sharded(copy_group)
    _step(local, local_opt, tokens, target)
    localcopy.take_calls()
    _step(local, local_opt, tokens, target)
    calls = localcopy.take_calls()
    samples = _rounds({"step": lambda: _step(model, opt, tokens, target),
                       "compute": lambda: _step(local, local_opt, tokens, target),
                       "alone": _alone(dist, calls)},
                      cfg["warmup"], cfg["steps"], dist.barrier)
    copies = _copies_ms(lambda: _step(model, opt, tokens, target))
    return {"samples": samples, "copies_ms": copies,
            "collectives": [list(c) for c in calls],
            "params": sum(p.numel() for p in local.parameters()) * cfg["world"]}


def main() -> None:
    config_path, rank = sys.argv[1], int(sys.argv[2])
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist = _init(cfg["side"], cfg, rank)
    if cfg["kind"] == "ddp":
        result = _ddp(dist, cfg, rank)
    else:
        result = _fsdp2(dist, cfg, rank)
    dist.barrier()
    out = os.path.join(os.path.dirname(config_path), f"rank{rank}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
