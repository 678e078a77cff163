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
