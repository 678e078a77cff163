"""rustdist's CUDA path on a GPU: every op against a reference at world 1 through NCCL (and the
host-staged routes NCCL lacks), world 2 on one GPU through the staged path (world 2 on two
GPUs through NCCL when there are two), torch's stream semantics with a second stream, the
watchdog aborting a timed-out op, both front doors against torch's ProcessGroupNCCL, and DDP
on CUDA against gloo on the CPU. Skipped without a CUDA device.

Run on a GPU machine with the wheel installed:

    python -m pytest tests/test_cuda_gpu.py -q
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import traceback
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

import rustdist  # noqa: E402
import rustdist._core as core  # noqa: E402
import rustdist.cuda as rcuda  # noqa: E402
from rustdist import distributed_c10d as c10d  # noqa: E402
from rustdist._torch_backend import new_process_group  # noqa: E402
from rustdist.bench.launch import free_port  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG, PREMUL_SUM = range(9)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _group(store: Any, rank: int, size: int, name: str, timeout: float = 30.0) -> Any:
    return new_process_group(store, rank, size, timeout, name, list(range(size)))


def _close(pg: Any) -> None:
    cuda = getattr(pg, "_cuda", None)
    if cuda is not None:
        cuda.shutdown()
    pg._pg.shutdown()


@pytest.fixture(scope="module")
def pg() -> Iterator[Any]:
    group = _group(core.HashStore(), 0, 1, "gpu-world-1")
    yield group
    _close(group)


def _sample(dtype: torch.dtype, n: int = 37) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.arange(n) % 3 == 0
    if dtype.is_complex:
        return torch.complex(torch.arange(n, dtype=torch.float64),
                             -torch.arange(n, dtype=torch.float64)).to(dtype)
    return (torch.arange(n) % 7 + 1).to(dtype)


def _valid(dtype: torch.dtype, op: int) -> bool:
    if op in (AVG, PREMUL_SUM):
        return dtype.is_floating_point or dtype.is_complex
    if op in (BAND, BOR, BXOR):
        return not (dtype.is_floating_point or dtype.is_complex)
    if op in (MIN, MAX):
        return not dtype.is_complex
    return True


@pytest.mark.timeout(60)
def test_the_dlpack_reader_reads_contiguous_cuda_tensors() -> None:
    from rustdist._tensor import REAL_TORCH_CODES, torch_code

    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    code = REAL_TORCH_CODES[torch.float32]
    assert core.cuda_buffer(t) == (t.data_ptr(), 12, code, t.get_device())
    row = t[1]  # an offset into the storage
    assert core.cuda_buffer(row) == (row.data_ptr(), 4, code, t.get_device())
    assert core.cuda_buffer(t.t()) is None  # not contiguous: the Python checks raise
    z = t.to(torch.complex64)
    assert core.cuda_buffer(z) is None  # complex: read by Python
    assert rcuda._buffer(z, "z") == (z.data_ptr(), 12, torch_code(z, "z"), t.get_device())


@pytest.mark.timeout(120)
def test_world_1_has_an_nccl_communicator(pg: Any) -> None:
    assert rcuda._cuda_group(pg, 0).mode == "nccl"
    assert rcuda.is_available()
    assert rcuda.load_report()["device_count"] == torch.cuda.device_count()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_every_op(pg: Any, dtype: torch.dtype) -> None:
    for op in range(9):
        x = _sample(dtype).cuda()
        premul = 0.5 if op == PREMUL_SUM else None
        if not _valid(dtype, op):
            with pytest.raises(RuntimeError, match="not supported"):
                rcuda.all_reduce(pg, x, op, premul)
            continue
        want = _sample(dtype) * 0.5 if op == PREMUL_SUM else _sample(dtype)
        rcuda.all_reduce(pg, x, op, premul)
        torch.testing.assert_close(x.cpu(), want.to(dtype), msg=f"op {op}")
        # reduce_scatter_tensor and reduce at world 1 are the same reduction.
        out = torch.empty_like(x)
        rcuda.reduce_scatter_tensor(pg, out, x, op, premul)
        expect = x.cpu() * 0.5 if op == PREMUL_SUM else x.cpu()
        torch.testing.assert_close(out.cpu(), expect.to(dtype))
        y = _sample(dtype).cuda()
        rcuda.reduce(pg, y, 0, op, premul)
        torch.testing.assert_close(y.cpu(), want.to(dtype))


@pytest.mark.timeout(120)
def test_data_movement_ops(pg: Any) -> None:
    for dtype in (torch.float32, torch.int16, torch.complex128, torch.bool):
        x = _sample(dtype).cuda()
        ref = x.cpu()
        rcuda.broadcast(pg, x, 0)
        torch.testing.assert_close(x.cpu(), ref)
        outs = [torch.empty_like(x)]
        rcuda.all_gather(pg, outs, x)
        torch.testing.assert_close(outs[0].cpu(), ref)
        flat = torch.empty_like(x)
        rcuda.all_gather_into_tensor(pg, flat, x)
        torch.testing.assert_close(flat.cpu(), ref)
        gathered = [torch.empty_like(x)]
        rcuda.gather(pg, x, gathered, 0)
        torch.testing.assert_close(gathered[0].cpu(), ref)
        scattered = torch.empty_like(x)
        rcuda.scatter(pg, scattered, [x], 0)
        torch.testing.assert_close(scattered.cpu(), ref)
        a2a = [torch.empty_like(x)]
        rcuda.all_to_all(pg, a2a, [x])
        torch.testing.assert_close(a2a[0].cpu(), ref)
        single = torch.empty_like(x)
        rcuda.all_to_all_single(pg, single, x, [x.shape[0]], [x.shape[0]])
        torch.testing.assert_close(single.cpu(), ref)
        for shaped in (x, x.reshape(1, -1), x[0]):  # equal splits: the engine lays out blocks
            even = torch.zeros_like(shaped)
            rcuda.all_to_all_single(pg, even, shaped)
            torch.testing.assert_close(even.cpu(), shaped.cpu())
    out = torch.empty(5, device="cuda")
    rcuda.reduce_scatter(pg, out, [torch.full((5,), 3.0, device="cuda")], SUM)
    assert out.tolist() == [3.0] * 5


@pytest.mark.timeout(120)
def test_cuda_operations_are_recorded_as_nccl_ones(tmp_path: Any) -> None:
    """A CUDA group records its operations in the flight recorder under NCCL's names, with
    states that reach completed once the GPU work has finished; its staging group is not in
    the dump (its steps are the CUDA group's); torch's analyzer reads the dump."""
    import pickle

    group = _group(core.HashStore(), 0, 1, "gpu-recorded")
    group._trace_as("gpu-recorded", "recorded")
    try:
        x = torch.ones(8, device="cuda")
        for _ in range(3):
            rcuda.all_reduce(group, x, SUM, async_op=True).wait()
        rcuda.broadcast(group, x, 0)
        torch.cuda.synchronize()
        path = core.flight_recorder_dump(str(tmp_path / "rank_"))
        with open(path, "rb") as f:
            dumped = pickle.load(f)
        ours = [e for e in dumped["entries"] if e["process_group"][0] == "gpu-recorded"]
        assert [e["profiling_name"] for e in ours] == ["nccl:all_reduce"] * 3 + ["nccl:broadcast"]
        assert [e["collective_seq_id"] for e in ours] == [1, 2, 3, 4]
        assert ours[0]["input_sizes"] == [[8]] and ours[0]["state"] == "completed"
        assert not any("cuda-staging" in name for name in dumped["pg_config"])
        analyzed = subprocess.run(
            [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
             str(tmp_path), "--prefix", "rank_"], capture_output=True, text=True, timeout=60)
        assert analyzed.returncode == 0, analyzed.stderr
    finally:
        _close(group)


@pytest.mark.timeout(120)
def test_cuda_operations_are_profiler_events(pg: Any) -> None:
    """A CUDA all_reduce, synchronous and asynchronous, is a ``rustdist:all_reduce`` event in
    torch.profiler with its metadata (docs/observability.md)."""
    from rustdist import _ops
    from rustdist._reduce_op import ReduceOp

    t = torch.ones(8, device="cuda")
    with torch.profiler.profile(record_shapes=True) as prof:
        _ops.all_reduce(pg, t, ReduceOp.SUM, False)
        work = _ops.all_reduce(pg, t, ReduceOp.SUM, True)
        work.wait()
        torch.cuda.synchronize()
        assert work.is_completed()
    events = [e for e in prof.events() if e.name.startswith("rustdist:")]
    spans = [e for e in events if e.name == "rustdist:all_reduce"]
    assert len(spans) == 2, [e.name for e in events]
    metas = [e.kwinputs for e in events if e.name == "rustdist:record_param_comms"]
    assert len(metas) == 2 and all(m["In msg nelems"] == 8 and m["dtype"] == "Float"
                                   for m in metas), metas


@pytest.mark.timeout(120)
def test_point_to_point_to_self(pg: Any) -> None:
    for tag in (0, 7):  # tag 0 through NCCL (a device copy), 7 through host memory
        src = torch.arange(10.0, device="cuda") + tag
        dst = torch.zeros(10, device="cuda")
        works = rcuda.batch_isend_irecv(pg, [(True, src, 0, tag), (False, dst, 0, tag)])
        for w in works:
            w.wait()
        assert dst.tolist() == src.tolist()
    dst = torch.zeros(3, device="cuda")
    with pytest.raises(RuntimeError, match="needs a nonzero tag"):
        rcuda.irecv(pg, dst, None, tag=0)
    rcuda.barrier(pg, 0)


@pytest.mark.timeout(120)
def test_stream_semantics_with_a_second_stream(pg: Any) -> None:
    side = torch.cuda.Stream()
    t = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        t.fill_(3.0)
        work = rcuda.all_reduce(pg, t, PREMUL_SUM, 2.0, async_op=True)
        # Enqueued behind the sleep and the fill: returned at once, not yet done.
        assert not work.is_completed()
        work.wait()  # the side stream waits on the device; the host does not block
        out = t.clone()
    side.synchronize()
    assert out.min().item() == 6.0 and out.max().item() == 6.0
    assert work.is_completed() and work.is_success()
    fut = work.get_future()
    assert fut.wait()[0] is t


@pytest.mark.timeout(120)
def test_future_completes_after_the_gpu_work(pg: Any) -> None:
    t = torch.ones(8, device="cuda")
    torch.cuda._sleep(100_000_000)
    work = rcuda.all_reduce(pg, t, SUM, async_op=True)
    seen: list[Any] = []
    work.get_future().then(lambda f: seen.append(f.value()))
    work._synchronize_host(30.0)
    assert work.is_completed()
    fut = work.get_future()
    assert fut.wait()[0] is t and len(seen) <= 1


@pytest.mark.timeout(120)
def test_watchdog_aborts_a_timed_out_op() -> None:
    group = _group(core.HashStore(), 0, 1, "gpu-timeout", timeout=2.0)
    try:
        t = torch.ones(4, device="cuda")
        rcuda.all_reduce(group, t, SUM)  # creates the communicator (sequence number 1)
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000_000)  # ~10 s: the op waits for it on the device
        work = rcuda.all_reduce(group, t, SUM, async_op=True)
        with pytest.raises(rustdist.DistBackendError, match=r"sequence number 2.*timeout"):
            work._synchronize_host(30.0)
        assert work.is_completed() and not work.is_success()
        with pytest.raises(rustdist.DistBackendError):
            rcuda.all_reduce(group, t, SUM)
    finally:
        group._cuda.abort()
        group._pg.shutdown()
        torch.cuda.synchronize()


def _world2_rank(rank: int, port: int, device: int, out: Any) -> None:
    try:
        torch.cuda.set_device(device)
        store = core.TCPStore("127.0.0.1", port, 2, rank == 0, 60.0)
        pg = _group(store, rank, 2, "gpu-world-2")
        peer = 1 - rank
        x = torch.full((6,), float(rank + 1), device="cuda")
        rcuda.all_reduce(pg, x, SUM)
        assert x.tolist() == [3.0] * 6, x
        mode = pg._cuda.mode
        bits = torch.tensor([1 << rank], dtype=torch.int32, device="cuda")
        rcuda.all_reduce(pg, bits, BOR)  # host-staged in either mode
        assert bits.item() == 3
        b = torch.arange(4.0, device="cuda") * (rank + 1)
        rcuda.broadcast(pg, b, 1)
        assert b.tolist() == [0.0, 2.0, 4.0, 6.0]
        outs = [torch.empty(r + 1, device="cuda") for r in range(2)]  # uneven sizes
        rcuda.all_gather(pg, outs, torch.full((rank + 1,), float(rank), device="cuda"))
        assert [o.tolist() for o in outs] == [[0.0], [1.0, 1.0]]
        inp = torch.arange(4.0, device="cuda") + 10 * rank
        rs = torch.empty(2, device="cuda")
        rcuda.reduce_scatter_tensor(pg, rs, inp, SUM)
        assert rs.tolist() == [10.0 + 4 * rank, 12.0 + 4 * rank], rs
        # all_to_all_single with uneven splits: rank r sends r+1 rows to each peer.
        send = torch.arange(2.0 * (rank + 1), device="cuda") + 100 * rank
        recv = torch.empty(3, device="cuda")
        rcuda.all_to_all_single(pg, recv, send, [1, 2], [rank + 1, rank + 1])
        expect = {0: [0.0, 100.0, 101.0], 1: [1.0, 102.0, 103.0]}[rank]
        assert recv.tolist() == expect, recv
        even = torch.empty(2, 3, device="cuda")  # equal splits: a row to each rank
        rcuda.all_to_all_single(pg, even, torch.arange(6.0, device="cuda").view(2, 3) + 10 * rank)
        assert even.tolist() == [[3.0 * rank, 3.0 * rank + 1, 3.0 * rank + 2],
                                 [10.0 + 3 * rank, 11.0 + 3 * rank, 12.0 + 3 * rank]], even
        msg = torch.full((5,), float(rank), device="cuda")
        got = torch.empty(5, device="cuda")
        works = rcuda.batch_isend_irecv(pg, [(True, msg, peer, 3), (False, got, peer, 3)])
        for w in works:
            w.wait()
        assert got.tolist() == [float(peer)] * 5
        # A receive from any source travels through host memory (nonzero tag on both sides).
        if rank == 0:
            rcuda.send(pg, msg, 1, tag=9)
        else:
            assert rcuda.recv(pg, got, None, tag=9) == 0
            assert got.tolist() == [0.0] * 5
        rcuda.barrier(pg, device)
        torch.cuda.synchronize()
        _close(pg)
        out.put((rank, "ok", mode))
    except BaseException:  # report everything to the parent
        out.put((rank, traceback.format_exc(), None))


def _run_world2(devices: tuple[int, int]) -> set[str]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_world2_rank, args=(r, port, devices[r], out)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    failures = [f"rank {r}: {msg}" for r, msg, _ in results if msg != "ok"]
    assert not failures, "\n".join(failures)
    return {mode for _, _, mode in results}


@pytest.mark.timeout(300)
def test_world_2_on_one_gpu_stages_through_host_memory() -> None:
    assert _run_world2((0, 0)) == {"staged"}


@pytest.mark.timeout(300)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_world_2_on_two_gpus_runs_on_nccl() -> None:
    assert _run_world2((0, 1)) == {"nccl"}


def _shrink_rank(rank: int, port: int, devices: tuple[int, ...], out: Any) -> None:
    """One rank of a world on `devices` whose last rank leaves; the others shrink the group
    (ncclCommShrink on distinct GPUs, the staging group alone on a shared one) and go on."""
    try:
        world = len(devices)
        torch.cuda.set_device(devices[rank])
        store = core.TCPStore("127.0.0.1", port, world, rank == 0, 60.0)
        pg = _group(store, rank, world, "gpu-shrink")
        x = torch.ones(6, device="cuda")
        rcuda.all_reduce(pg, x, SUM)
        assert x.tolist() == [float(world)] * 6, x
        rcuda.barrier(pg, devices[rank])
        if rank == world - 1:
            os._exit(0)
        shrunk = pg._shrunk([world - 1], True)
        mode = shrunk._cuda.mode
        y = torch.full((1000,), float(rank + 1), device="cuda")
        rcuda.all_reduce(shrunk, y, SUM)
        torch.cuda.synchronize()
        assert y.eq(float(sum(range(1, world)))).all().item(), y[:4]
        _close(shrunk)
        out.put((rank, "ok", mode))
    except BaseException:  # report everything to the parent
        out.put((rank, traceback.format_exc(), None))


def _run_shrink(devices: tuple[int, ...]) -> set[str]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_shrink_rank, args=(r, port, devices, out))
             for r in range(len(devices))]
    for p in procs:
        p.start()
    results = [out.get(timeout=240) for _ in procs[:-1]]
    for p in procs:
        p.join(timeout=60)
    failures = [f"rank {r}: {msg}" for r, msg, _ in results if msg != "ok"]
    assert not failures, "\n".join(failures)
    return {mode for _, _, mode in results}


@pytest.mark.timeout(300)
def test_shrink_on_one_gpu_shrinks_the_staging_group() -> None:
    assert _run_shrink((0, 0, 0)) == {"staged"}


@pytest.mark.timeout(300)
@pytest.mark.skipif(torch.cuda.device_count() < 3 or rcuda.nccl_version() < (2, 27, 0),
                    reason="needs 3 CUDA devices and NCCL >= 2.27 (ncclCommShrink)")
def test_shrink_on_three_gpus_runs_ncclcommshrink() -> None:
    assert _run_shrink((0, 1, 2)) == {"nccl"}


def _front_door_ops(dist: Any) -> dict[str, torch.Tensor]:
    """Collectives of the public API on CUDA tensors at world 1 (results by name)."""
    x = torch.arange(8.0, device="cuda")
    out = {}
    dist.all_reduce(x)
    out["all_reduce"] = x.clone()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = x.clone()
    dist.broadcast(x, src=0)
    out["broadcast"] = x.clone()
    g = torch.empty(8, device="cuda")
    dist.all_gather_into_tensor(g, x)
    out["all_gather_into_tensor"] = g
    r = torch.empty(8, device="cuda")
    dist.reduce_scatter_tensor(r, x)
    out["reduce_scatter_tensor"] = r
    a = torch.empty(8, device="cuda")
    dist.all_to_all_single(a, x)
    out["all_to_all_single"] = a
    lst = [torch.empty(8, device="cuda")]
    dist.all_gather(lst, x)
    out["all_gather"] = lst[0]
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    out["async"] = w.get_future().wait()[0].clone()
    objs = [None]
    dist.all_gather_object(objs, {"rank": 0})
    assert objs == [{"rank": 0}]
    dist.barrier()
    torch.cuda.synchronize()
    return out


@pytest.mark.timeout(180)
def test_both_front_doors_match_torch_nccl() -> None:
    import torch.distributed as td

    td.init_process_group("nccl", store=td.HashStore(), rank=0, world_size=1)
    want = _front_door_ops(td)
    td.destroy_process_group()
    rustdist.init_process_group("nccl", store=rustdist.HashStore(), rank=0, world_size=1)
    got = _front_door_ops(rustdist)
    assert rustdist.group.WORLD._cuda.mode == "nccl"
    rustdist.destroy_process_group()
    td.init_process_group("rustdist", store=td.HashStore(), rank=0, world_size=1)
    via_torch = _front_door_ops(td)
    assert isinstance(td.group.WORLD, rustdist.ProcessGroup)
    td.destroy_process_group()
    for name, ref in want.items():
        torch.testing.assert_close(got[name], ref, msg=lambda m, n=name: f"rustdist {n}: {m}")
        torch.testing.assert_close(via_torch[name], ref,
                                   msg=lambda m, n=name: f"torch door {n}: {m}")


def _ddp_rank(rank: int, port: int, backend: str, device: str, out: Any) -> None:
    import torch.distributed as td
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    try:
        td.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                              world_size=2)
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(rank)
        for _ in range(10):
            x = torch.randn(16, 8, generator=data).to(device)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        # numpy arrays travel by value: a tensor's storage would be shared through a file
        # descriptor that the parent fetches from this process, gone once it has exited.
        out.put((rank, [p.detach().cpu().numpy() for p in model.parameters()]))
        td.destroy_process_group()
    except BaseException:  # report everything to the parent
        out.put((rank, traceback.format_exc()))


def _ddp_world2(backend: str, device: str) -> list[Any]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_rank, args=(r, port, backend, device, out))
             for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    failed = [f"rank {r}: {v}" for r, v in results.items() if isinstance(v, str)]
    assert not failed, "\n".join(failed)
    return [results[0], results[1]]


@pytest.mark.timeout(300)
def test_ddp_on_cuda_matches_gloo_on_cpu() -> None:
    """DDP on CUDA through the "rustdist" backend (two ranks on one GPU: the staged path)
    ends with the parameters of the same training on gloo on the CPU."""
    import rustdist  # noqa: F401 - registers the backend in the spawned ranks too

    gpu = _ddp_world2("rustdist", "cuda")
    cpu = _ddp_world2("gloo", "cpu")
    for rank in range(2):
        for a, b in zip(gpu[rank], cpu[rank]):
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("op", ["all_reduce_coalesced", "all_gather", "all_gather_coalesced",
                                "all_to_all", "gather", "scatter", "reduce_scatter",
                                "all_to_all_single", "batch_isend_irecv"])
def test_tensors_sharing_memory_give_what_copies_give(op: str) -> None:
    """The aliasing property test (tests/alias_cases.py) on CUDA tensors at world 1, through
    the import-swap door; and a tensor listed twice in all_reduce_coalesced is reduced once
    (PREMUL_SUM by 2: 2x, where reducing it twice gives 4x)."""
    import alias_cases

    c10d.init_process_group("rustdist", store=core.HashStore(), rank=0, world_size=1)
    try:
        for async_op in (False, True):
            aliased = alias_cases.case_alias_property(rustdist, 0, 1, op, trials=12, seed=25,
                                                      async_op=async_op, device="cuda")
            assert aliased > 0
        t = torch.ones(3, device="cuda")
        rustdist.all_reduce_coalesced([t, t], op=rustdist.make_premul_sum(2.0))
        assert torch.equal(t.cpu(), torch.full((3,), 2.0))
    finally:
        c10d.destroy_process_group()
