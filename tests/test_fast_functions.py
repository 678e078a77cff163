"""The hot collectives' fast functions (builtins in front of the Python functions, see
``_core.fast_function``) look like torch.distributed's functions to code that inspects or
pickles them, and a call they cannot take raises what the Python function raises."""

import inspect
import pickle
from typing import Any

import pytest
import torch
import torch.distributed as td

import rustdist

HOT = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single", "barrier")


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", HOT)
def test_parameters_and_defaults_are_torch_s(name: str) -> None:
    assert _params(getattr(rustdist, name)) == _params(getattr(td, name))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", HOT)
def test_name_module_docstring_and_pickling(name: str) -> None:
    fn = getattr(rustdist, name)
    assert (fn.__name__, fn.__module__) == (name, "rustdist.distributed_c10d")
    doc = inspect.getdoc(fn) or ""
    # The Python function's docstring, without the signature lines CPython reads first.
    assert len(doc) > 100 and doc[0].isupper(), f"{name}: {doc[:80]!r}"
    assert "\n--\n" not in doc
    assert pickle.loads(pickle.dumps(fn)) is fn


@pytest.mark.timeout(30)
def test_calls_the_fast_path_cannot_take_raise_python_s_errors() -> None:
    t = torch.zeros(2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'srcc'"):
        rustdist.broadcast(t, srcc=0)
    with pytest.raises(TypeError, match="multiple values for argument 'tensor'"):
        rustdist.broadcast(t, tensor=t)
    with pytest.raises(TypeError, match="positional argument"):
        rustdist.all_to_all_single(t, t, None, None, None, False, None)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        rustdist.broadcast(t, src=0)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        rustdist.all_reduce(t)


FAST_METHODS = {"allreduce": (), "broadcast": (),
                "_allgather_base": ("all_gather_single",),
                "_reduce_scatter_base": ("reduce_scatter_single",), "barrier": ()}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", FAST_METHODS)
def test_group_methods_keep_their_python_signature_and_aliases(name: str) -> None:
    method = getattr(rustdist.ProcessGroup, name)
    python = inspect.unwrap(method)
    assert inspect.isfunction(method), "pybind11 must see a Python override, not a builtin"
    assert method.__name__ == name and (method.__doc__ or "") == (python.__doc__ or "")
    assert _params(method) == _params(python) and _params(method)[0][0] == "self"
    assert method.__defaults__ == python.__defaults__  # inspect.signature reads python's
    for alias in FAST_METHODS[name]:
        assert getattr(rustdist.ProcessGroup, alias) is method


@pytest.mark.timeout(60)
def test_front_door_sync_calls_return_no_work_and_the_rest_goes_to_python() -> None:
    """torch's synchronous calls get None ("the backend has synchronised"); asynchronous ones
    (C++ callers' default) a Work; other ops and bad arguments take the Python methods."""
    td.init_process_group("rustdist", store=td.HashStore(), rank=0, world_size=1)
    try:
        pg = td.group.WORLD
        t = torch.arange(6.0)
        sync = td.AllreduceOptions()
        sync.asyncOp = False
        assert pg.allreduce([t], sync) is None and pg.allreduce(t, sync) is None
        assert td.all_reduce(t) is None and torch.equal(t, torch.arange(6.0))
        sync.reduceOp = td.ReduceOp.MAX
        assert pg.allreduce([t], sync) is None  # not SUM: the Python method
        work = pg.allreduce([t], td.AllreduceOptions())  # asyncOp defaults to True
        assert work is not None and work.wait() and work.result()[0] is t
        out = torch.empty(6)
        assert td.all_gather_into_tensor(out, t) is None and torch.equal(out, t)
        assert td.reduce_scatter_tensor(out, t) is None and torch.equal(out, t)
        assert td.broadcast(t, src=0) is None and td.barrier() is None
        with pytest.raises(RuntimeError, match="invalid root rank: 1"):  # as gloo says
            td.broadcast(t, src=1)
        with pytest.raises(TypeError, match="missing 1 required positional argument"):
            pg.allreduce()
        with pytest.raises(TypeError, match="unexpected keyword argument 'tensor'"):
            pg.allreduce(tensor=t)
    finally:
        td.destroy_process_group()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("door", ["import swap", "torch"])
def test_async_calls_skip_the_python_layer_and_return_its_work(
        door: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``async_op=True`` (and the group methods' C++ callers, whose options default to
    asynchronous) run on the engine without the Python functions, returning the Work those
    return: rustdist's, holding the outputs, handed to torch from the methods; a call the fast
    path does not take (MAX) still reaches Python."""
    from rustdist import _ops
    from rustdist._work import Work

    reached: list[str] = []
    for name in HOT:
        real = getattr(_ops, name)
        monkeypatch.setattr(_ops, name, lambda *a, _n=name, _f=real: reached.append(_n) or _f(*a))
    dist: Any = rustdist if door == "import swap" else td
    dist.init_process_group("rustdist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t, out, square = torch.arange(6.0), torch.empty(6), torch.arange(6.0).reshape(3, 2)
        square_out = torch.empty(3, 2)
        calls = {
            "all_reduce": (lambda: dist.all_reduce(t, async_op=True), [t]),
            "broadcast": (lambda: dist.broadcast(t, 0, async_op=True), [t]),
            "all_gather_into_tensor": (
                lambda: dist.all_gather_into_tensor(out, t, async_op=True), [out]),
            "reduce_scatter_tensor": (
                lambda: dist.reduce_scatter_tensor(out, t, async_op=True), [out]),
            "barrier": (lambda: dist.barrier(async_op=True), []),
            "reduce_scatter_tensor, every argument by position": (
                lambda: dist.reduce_scatter_tensor(out, t, dist.ReduceOp.SUM, None, True), [out]),
        }
        if door == "import swap":  # torch's all_to_all_single runs no group method of these
            calls["all_to_all_single"] = (
                lambda: dist.all_to_all_single(square_out, square, async_op=True), [square_out])
        else:
            calls["allreduce, C++ callers' options"] = (
                lambda: td.group.WORLD.allreduce([t], td.AllreduceOptions()), [t])
        for what, (start, outputs) in calls.items():
            out.fill_(float("nan"))
            square_out.fill_(float("nan"))
            work = start()
            assert type(work) is Work, f"{what}: {type(work)}"
            assert work.wait() is True and work.is_completed() and work.is_success(), what
            assert work._for_torch is (door == "torch"), what
            assert all(a is b for a, b in zip(work.result(), outputs, strict=True)), what
            assert all(a is b for a, b in zip(work.get_future().wait(), outputs, strict=True)), what
            for tensor in outputs:  # a world of one: every output is its rank's input
                assert torch.equal(tensor, torch.arange(6.0).reshape(tensor.shape)), what
        assert reached == [], f"the Python functions ran: {reached}"
        work = dist.all_reduce(t, dist.ReduceOp.MAX, async_op=True)
        assert type(work) is Work and work.wait() and reached == ["all_reduce"]
    finally:
        dist.destroy_process_group()
