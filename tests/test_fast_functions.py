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
    (C++ callers' default), other ops and bad arguments take the Python methods."""
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
