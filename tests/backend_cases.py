"""Cases for tests/test_torch_backend.py: torch.distributed (and DDP, FSDP2, DeviceMesh,
DTensor, functional collectives) running on the "rustdist" backend.

Run as one rank of a world: ``python backend_cases.py SUITE BACKEND OUT_DIR`` with MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE set. The rank runs every case of SUITE in order and writes
``OUT_DIR/rank<r>.json`` ({case: "ok" or the traceback}); training cases also save their final
parameters as ``OUT_DIR/<case>-rank<r>.pt`` so the driver can compare a rustdist run with a
gloo run of the same script. References of the collective cases are computed locally.
"""

import json
import os
import sys
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

import rustdist._torch_backend

STEPS = 20


def rank_data(rank: int, n: int, seed: int = 0) -> torch.Tensor:
    """Integer-valued float data any rank can rebuild for any rank (sums stay exact)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-8, 9, (n,), generator=g).float()


def eq(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# collectives through torch.distributed


def case_backend_name(rank: int, world: int) -> None:
    assert dist.get_backend() == "rustdist", dist.get_backend()
    pg = dist.group.WORLD
    assert isinstance(pg, rustdist.ProcessGroup), type(pg)
    assert pg.name() == "rustdist" and pg.rank() == rank and pg.size() == world


def case_all_reduce(rank: int, world: int) -> None:
    for n in (0, 1, 1001, 100_000):
        want = sum(rank_data(r, n) for r in range(world))
        t = rank_data(rank, n)
        dist.all_reduce(t)
        eq(t, want)
    for op, fn in ((dist.ReduceOp.MAX, torch.maximum), (dist.ReduceOp.MIN, torch.minimum)):
        want = rank_data(0, 50)
        for r in range(1, world):
            want = fn(want, rank_data(r, 50))
        t = rank_data(rank, 50)
        dist.all_reduce(t, op=op)
        eq(t, want)
    t = torch.full((5,), float(rank), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    eq(t, torch.full((5,), (world - 1) / 2, dtype=torch.float64))
    c = torch.tensor([1 + 2j], dtype=torch.complex64) * (rank + 1)
    dist.all_reduce(c)
    eq(c, torch.tensor([1 + 2j], dtype=torch.complex64) * sum(range(1, world + 1)))


def case_async_future(rank: int, world: int) -> None:
    t = torch.ones(8) * rank
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    eq(fut.wait(), torch.ones(8) * sum(range(world)) * 2)
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.wait()
    eq(work.result()[0], torch.ones(8) * sum(range(world)))


def case_failed_op_fails_its_future(rank: int, world: int) -> None:
    """The future torch's C++ gets from a failed operation (typed List[Tensor], as DDP's
    reducer waits on it) fails with the operation's error instead of completing with the
    untouched tensors. Here the ranks disagree on the size, so the all_reduce fails on all."""
    g = dist.new_group(list(range(world)))
    t = torch.ones(4 + rank)
    try:
        work = g.allreduce([t])  # the method C++ calls: asynchronous
    except RuntimeError as e:
        # A rank that heard of the failure from a peer (which found the mismatch first)
        # before it made the call fails at the call, with the same error.
        assert "all_reduce mismatch between ranks: tensor size differs" in str(e), e
        dist.destroy_process_group(g)
        return
    try:
        got = work.get_future().wait()
    except RuntimeError as e:
        assert "all_reduce mismatch between ranks: tensor size differs" in str(e), e
    else:
        raise AssertionError(f"the future of a failed all_reduce completed with {got}")
    assert not work.is_success() and work.exception() is not None
    dist.destroy_process_group(g)


def case_broadcast(rank: int, world: int) -> None:
    for src in range(world):
        t = rank_data(rank, 333)
        dist.broadcast(t, src=src)
        eq(t, rank_data(src, 333))


def case_all_gather(rank: int, world: int) -> None:
    out = [torch.empty(77) for _ in range(world)]
    dist.all_gather(out, rank_data(rank, 77))
    for r in range(world):
        eq(out[r], rank_data(r, 77))
    flat = torch.empty(world * 77)
    dist.all_gather_into_tensor(flat, rank_data(rank, 77))
    eq(flat, torch.cat([rank_data(r, 77) for r in range(world)]))


def case_reduce_scatter(rank: int, world: int) -> None:
    n = 41
    full = sum(rank_data(r, world * n) for r in range(world))
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, rank_data(rank, world * n))
    eq(out, full[rank * n:(rank + 1) * n])
    out = torch.empty(n)
    dist.reduce_scatter(out, list(rank_data(rank, world * n).chunk(world)))
    eq(out, full[rank * n:(rank + 1) * n])


def case_send_recv(rank: int, world: int) -> None:
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t = torch.empty(10)
    if rank % 2 == 0:
        dist.send(rank_data(rank, 10), nxt)
        dist.recv(t, prv)
    else:
        dist.recv(t, prv)
        dist.send(rank_data(rank, 10), nxt)
    eq(t, rank_data(prv, 10))
    ops = [dist.P2POp(dist.isend, rank_data(rank, 5), nxt),
           dist.P2POp(dist.irecv, t[:5], prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    eq(t[:5], rank_data(prv, 5))
    if rank == 0:
        got = set()
        for _ in range(world - 1):
            got.add(dist.recv(t[:1]))
        assert got == set(range(1, world)), got
    else:
        dist.send(torch.ones(1), 0)


def case_barrier_and_objects(rank: int, world: int) -> None:
    dist.barrier()
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)], objs
    lst = [f"from {rank}", rank]
    dist.broadcast_object_list(lst, src=world - 1)
    assert lst == [f"from {world - 1}", world - 1], lst


def case_subgroup(rank: int, world: int) -> None:
    ranks = [r for r in range(world) if r % 2 == 0]
    sub = dist.new_group(ranks, backend="rustdist")
    if rank in ranks:
        t = torch.ones(3) * rank
        dist.all_reduce(t, group=sub)
        eq(t, torch.ones(3) * sum(ranks))
        t = torch.zeros(3) + rank
        dist.broadcast(t, src=ranks[-1], group=sub)
        eq(t, torch.ones(3) * ranks[-1])
    dist.barrier()


def case_coalescing(rank: int, world: int) -> None:
    a, b = torch.ones(4) * rank, torch.ones(7) * (rank + 1)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    eq(a, torch.ones(4) * sum(range(world)))
    eq(b, torch.ones(7) * sum(range(1, world + 1)))


def case_monitored_barrier(rank: int, world: int) -> None:
    # torch.distributed.monitored_barrier refuses every backend but gloo by name; the group's
    # own method is what it would call.
    dist.group.WORLD.monitored_barrier(timedelta(seconds=10), wait_all_ranks=True)


def case_reduce(rank: int, world: int) -> None:
    for dst in range(world):
        t = rank_data(rank, 64)
        dist.reduce(t, dst=dst)
        if rank == dst:
            eq(t, sum(rank_data(r, 64) for r in range(world)))


def case_gather_scatter(rank: int, world: int) -> None:
    dst = world - 1
    gl = [torch.empty(9) for _ in range(world)] if rank == dst else None
    dist.gather(rank_data(rank, 9), gl, dst=dst)
    if rank == dst:
        for r in range(world):
            eq(gl[r], rank_data(r, 9))
    out = torch.empty(9)
    sl = [rank_data(r, 9, seed=5) for r in range(world)] if rank == 0 else None
    dist.scatter(out, sl, src=0)
    eq(out, rank_data(rank, 9, seed=5))


def case_all_to_all(rank: int, world: int) -> None:
    n = 6
    inp = torch.arange(world * n, dtype=torch.float32) + 100 * rank
    out = torch.empty(world * n)
    dist.all_to_all_single(out, inp)
    eq(out, torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float32) + 100 * r
                       for r in range(world)]))
    # uneven: rank r sends (dst + 1) elements of value 10*r+dst to rank dst
    in_splits = [d + 1 for d in range(world)]
    out_splits = [rank + 1] * world
    inp = torch.cat([torch.full((d + 1,), 10.0 * rank + d) for d in range(world)])
    out = torch.empty(sum(out_splits))
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    eq(out, torch.cat([torch.full((rank + 1,), 10.0 * r + rank) for r in range(world)]))
    outs = [torch.empty(3) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((3,), 10.0 * rank + d) for d in range(world)])
    for r in range(world):
        eq(outs[r], torch.full((3,), 10.0 * r + rank))


def case_funcol_eager(rank: int, world: int) -> None:
    group = dist.group.WORLD
    t = rank_data(rank, 12)
    eq(funcol.all_reduce(t, "sum", group), sum(rank_data(r, 12) for r in range(world)))
    eq(funcol.all_gather_tensor(t, 0, group), torch.cat([rank_data(r, 12) for r in range(world)]))
    big = rank_data(rank, 4 * world)
    want = sum(rank_data(r, 4 * world) for r in range(world))[rank * 4:(rank + 1) * 4]
    eq(funcol.reduce_scatter_tensor(big, "sum", 0, group), want)
    out = torch.empty(world * 12)
    torch.ops._c10d_functional.all_gather_into_tensor_out(t, world, group.group_name, out=out)
    eq(out, torch.cat([rank_data(r, 12) for r in range(world)]))


def case_funcol_inflight(rank: int, world: int) -> None:
    from torch._C._distributed_c10d import _set_allow_inflight_collective_as_graph_input

    _set_allow_inflight_collective_as_graph_input(True)
    try:
        t = torch.ones(1000) * rank
        dist.all_reduce(t, async_op=True)  # the Work is found again through the tensor
        got = torch.ops._c10d_functional.wait_tensor(t)
        eq(got, torch.ones(1000) * sum(range(world)))
    finally:
        _set_allow_inflight_collective_as_graph_input(False)


def case_funcol_compiled(rank: int, world: int) -> None:
    group_name = dist.group.WORLD.group_name

    @torch.compile(backend="inductor", fullgraph=True)
    def step(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", group_name)
        return funcol.all_gather_tensor(y + 1, 0, group_name)

    t = rank_data(rank, 8)
    total = sum(rank_data(r, 8) for r in range(world)) * 2 + 1
    eq(step(t), total.repeat(world))


# ---------------------------------------------------------------------------------------------
# DDP, FSDP2 (final parameters saved; the driver compares them with a gloo run)


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def save(name: str, rank: int, model: nn.Module) -> None:
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
             for k, v in model.state_dict().items()}
    torch.save(state, os.path.join(OUT_DIR, f"{name}-rank{rank}.pt"))


def train(model: nn.Module, rank: int, steps: int, no_sync_every: int = 0) -> None:
    """SGD on MSE; with ``no_sync_every`` every such step only accumulates gradients (under
    DDP's no_sync) into the next one."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batch(rank, step)
        if no_sync_every and step % no_sync_every == 0:
            with model.no_sync():
                nn.functional.mse_loss(model(x), y).backward()
            continue
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _ddp(unused: bool = False, **kw: Any) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(WithUnused() if unused else mlp(), **kw)


def case_ddp_default(rank: int, world: int) -> None:
    model = _ddp()
    train(model, rank, STEPS)
    save("ddp_default", rank, model)


def case_ddp_group(rank: int, world: int) -> None:
    group = dist.new_group(list(range(world)))
    model = _ddp(process_group=group, bucket_cap_mb=0.001)
    train(model, rank, STEPS)
    save("ddp_group", rank, model)


def case_ddp_no_sync(rank: int, world: int) -> None:
    model = _ddp()
    train(model, rank, STEPS, no_sync_every=3)
    save("ddp_no_sync", rank, model)


def case_ddp_py_hook(rank: int, world: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = _ddp()
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    train(model, rank, STEPS)
    save("ddp_py_hook", rank, model)


def case_ddp_unused(rank: int, world: int) -> None:
    model = _ddp(unused=True, find_unused_parameters=True)
    train(model, rank, STEPS)
    save("ddp_unused", rank, model)


def case_ddp_fp16_builtin(rank: int, world: int) -> None:
    # DDP's C++ comm hook: its continuation asserts the allreduce future holds a TensorList.
    model = _ddp()
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    train(model, rank, STEPS)
    save("ddp_fp16_builtin", rank, model)


def case_ddp_compiled(rank: int, world: int) -> None:
    # Checked against one process training on every rank's batch (DDP averages gradients).
    steps = 3
    model = torch.compile(_ddp())
    train(model, rank, steps)
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(steps):
        batches = [batch(r, step) for r in range(world)]
        (sum(nn.functional.mse_loss(ref(x), y) for x, y in batches) / world).backward()
        opt.step()
        opt.zero_grad()
    for got, want in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(got, want)


def _fsdp(rank: int, steps: int) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


def case_fsdp_1(rank: int, world: int) -> None:
    save("fsdp_1", rank, _fsdp(rank, 1))


def case_fsdp_3(rank: int, world: int) -> None:
    save("fsdp_3", rank, _fsdp(rank, 3))


# ---------------------------------------------------------------------------------------------
# DeviceMesh and DTensor (world 4)


def case_mesh_1d(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    t = torch.ones(2) * rank
    dist.all_reduce(t, group=mesh.get_group())
    eq(t, torch.ones(2) * sum(range(world)))
    again = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    t = torch.ones(2)
    dist.all_reduce(t, group=again.get_group())
    eq(t, torch.ones(2) * world)


def case_mesh_2d(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]
    row, col = divmod(rank, world // 2)
    t = torch.ones(1) * rank
    dist.all_reduce(t, group=tp.get_group())
    eq(t, torch.ones(1) * sum(row * (world // 2) + c for c in range(world // 2)))
    t = torch.ones(1) * rank
    dist.all_reduce(t, group=dp.get_group())
    eq(t, torch.ones(1) * sum(r * (world // 2) + col for r in range(2)))
    assert dp.get_local_rank() == row and tp.get_local_rank() == col
    flat = mesh._flatten("dp_tp")
    t = torch.ones(1)
    dist.all_reduce(t, group=flat.get_group())
    eq(t, torch.ones(1) * world)


def case_dtensor(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    a, b = torch.randn(8, 8), torch.randn(8, 4)  # both dims divide by world 4
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    eq(da.to_local(), a.chunk(world)[rank])
    torch.testing.assert_close(da.redistribute(mesh, [Replicate()]).to_local(), a)
    torch.testing.assert_close(da.redistribute(mesh, [Shard(1)]).to_local(),
                               a.chunk(world, dim=1)[rank])
    torch.testing.assert_close((da @ db).full_tensor(), a @ b)
    # column-parallel weight: the matmul needs the sharded weight gathered or partial sums
    dw = distribute_tensor(b, mesh, [Shard(0)]).requires_grad_()
    dx = distribute_tensor(a, mesh, [Shard(1)])
    out = dx @ dw
    torch.testing.assert_close(out.full_tensor(), a @ b)
    out.sum().backward()
    torch.testing.assert_close(dw.grad.full_tensor(), a.sum(0, keepdim=True).T.expand(8, 4))


def case_dtensor_tp_2d(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module)

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(mesh["dp"].get_local_rank()))
    out = model(x)
    torch.testing.assert_close(out, ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(model[0].weight.grad.full_tensor(), ref[0].weight.grad)


def case_rustdist_api_on_torch_world(rank: int, world: int) -> None:
    """After torch.distributed.init_process_group("rustdist"), rustdist's own functions with
    no group= run on that world, and rustdist.new_group makes groups torch knows."""
    assert rustdist.is_initialized() and rustdist.group.WORLD is dist.group.WORLD
    assert rustdist.get_rank() == rank and rustdist.get_world_size() == world
    t = rank_data(rank, 100)
    rustdist.all_reduce(t)
    eq(t, sum(rank_data(r, 100) for r in range(world)))
    g = rustdist.new_group(list(range(world - 1, -1, -1)))
    assert dist.get_process_group_ranks(g) == list(range(world)), dist.get_process_group_ranks(g)
    t = torch.ones(3)
    dist.all_reduce(t, group=g)
    eq(t, torch.full((3,), float(world)))
    rustdist.destroy_process_group(g)
    assert rustdist.is_initialized() and dist.is_initialized()


SUITES: dict[str, list[Callable[[int, int], None]]] = {
    "collectives": [case_backend_name, case_all_reduce, case_async_future,
                    case_failed_op_fails_its_future, case_broadcast,
                    case_all_gather, case_reduce_scatter, case_send_recv,
                    case_barrier_and_objects, case_subgroup, case_coalescing,
                    case_funcol_eager, case_funcol_inflight, case_reduce,
                    case_gather_scatter, case_all_to_all, case_monitored_barrier,
                    case_rustdist_api_on_torch_world],
    "compiled": [case_funcol_compiled, case_ddp_compiled],
    "ddp": [case_ddp_default, case_ddp_group, case_ddp_no_sync, case_ddp_py_hook,
            case_ddp_unused, case_ddp_fp16_builtin],
    "fsdp": [case_fsdp_1, case_fsdp_3],
    "mixed": [case_all_reduce, case_broadcast],  # init "cpu:rustdist,cuda:nccl"
    "mesh": [case_mesh_1d, case_mesh_2d, case_dtensor, case_dtensor_tp_2d],
}
#: Cases whose checks need rustdist itself (the rest also run on gloo, for the comparisons).
RUSTDIST_ONLY = {"case_backend_name", "case_failed_op_fails_its_future",
                 "case_monitored_barrier", "case_rustdist_api_on_torch_world"}

OUT_DIR = ""


def main() -> None:
    global OUT_DIR
    suite, backend, OUT_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    rustdist._torch_backend.register()  # idempotent; `import rustdist` does it too
    dist.init_process_group(backend, timeout=timedelta(seconds=30))
    results: dict[str, str] = {}
    for case in SUITES[suite]:
        if backend != "rustdist" and case.__name__ in RUSTDIST_ONLY:
            continue
        try:
            case(rank, world)
            results[case.__name__] = "ok"
        except Exception:  # noqa: BLE001 - reported per case to the driver
            results[case.__name__] = traceback.format_exc()
    with open(os.path.join(OUT_DIR, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
