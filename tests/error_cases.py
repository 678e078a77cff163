"""Cases for torch's exception types and texts (issue 25), run inside the rank processes.

Every entry of :data:`CHECKS` is one assertion of torch's own tests (``assertRaises`` /
``assertRaisesRegex``) on an error a process group, or the torch.distributed function in front
of it, raises: the exception type torch expects and torch's regex, written here from what those
tests assert (``test/distributed/test_c10d_gloo.py``, ``test/distributed/test_c10d_common.py``
and ``torch/testing/_internal/distributed/distributed_test.py``). The driver runs
``"error_cases:check"`` with the entry's name; every rank makes the call (with arguments that
make it fail on every rank, so that no rank is left inside a collective), checks the type with
``isinstance`` and the text with ``re.search`` as ``assertRaisesRegex`` does (case-sensitive),
then proves the default group still works.

The backend-level checks of ``test_c10d_gloo.py`` call the backend object of the default group
(``group.WORLD._get_backend(cpu)``: ``ProcessGroupGloo`` under gloo, rustdist's group itself on
both of rustdist's doors) with torch's option objects. The cases that need ranks to differ
(timeouts, monitored barriers) are functions of their own below the table.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any, Callable, NamedTuple

import torch

from dist_cases import sanity
from harness import ctx

#: A call that should raise, made by every rank.
Thunk = Callable[[], Any]


class Check(NamedTuple):
    """One assertion of torch's tests: where it is, the type and regex torch expects, the
    world sizes it runs at, and a builder of the call from ``(dist, rank, world)``."""

    source: str
    kind: type
    regex: str
    worlds: tuple[int, ...]
    build: Callable[[Any, int, int], Thunk]


GLOO = "test_c10d_gloo.py::ProcessGroupGlooTest"
COMMON = "test_c10d_common.py"
DIST = "distributed_test.py::DistributedTest"


def expect(kind: type, regex: str, fn: Thunk, what: str) -> BaseException:
    """``assertRaisesRegex(kind, regex)`` around ``fn``: the raised error must be a ``kind``
    whose message ``re.search`` finds ``regex`` in (case-sensitive, as unittest's). A call that
    does not raise is waited for (a Work it returns) before the failure is reported."""
    try:
        result = fn()
    except BaseException as e:  # noqa: BLE001 - every error is compared with the expected one
        if not isinstance(e, kind):
            raise AssertionError(f"{what}: expected {kind.__name__} matching {regex!r}, got "
                                 f"{type(e).__name__}: {e}") from e
        if not re.search(regex, str(e)):
            raise AssertionError(f"{what}: raised {type(e).__name__} as expected, but "
                                 f"{regex!r} does not match its message: {e}") from e
        return e
    if hasattr(result, "wait"):
        result.wait()
    raise AssertionError(f"{what}: expected {kind.__name__} matching {regex!r}, nothing was "
                         "raised")


def _backend(dist: Any) -> Any:
    """The backend object serving CPU tensors in the default group: what torch's gloo tests
    call directly (ProcessGroupGloo); rustdist's group on both of rustdist's doors."""
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _opts(dist: Any, kind: str, **fields: Any) -> Any:
    """torch's options object ``kind`` (e.g. ``BroadcastOptions``) with ``fields`` set."""
    opts = getattr(dist, kind)()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _t1() -> torch.Tensor:
    return torch.zeros([1], dtype=torch.float32)


def _t2() -> torch.Tensor:
    return torch.zeros([1], dtype=torch.float64)


def _t3() -> torch.Tensor:
    return torch.zeros([2], dtype=torch.float32)


def _sparse(n: int) -> torch.Tensor:
    """A sparse COO vector of ``n`` elements with one entry."""
    return torch.sparse_coo_tensor([[0]], [1.0], size=(n,), check_invariants=True)


# ---------------------------------------------------------------------------------------------
# test_c10d_gloo.py: the backend's own argument checks (RuntimeError)


def _broadcast(root: Callable[[int, int], int], root_tensor: int,
               tensors: Callable[[], list[torch.Tensor]]) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        opts = _opts(dist, "BroadcastOptions", rootRank=root(rank, world), rootTensor=root_tensor)
        return lambda: _backend(dist).broadcast(tensors(), opts)
    return build


def _allreduce(tensors: Callable[[], list[torch.Tensor]],
               op: str = "SUM") -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        opts = _opts(dist, "AllreduceOptions", reduceOp=getattr(dist.ReduceOp, op))
        return lambda: _backend(dist).allreduce(tensors(), opts)
    return build


def _allreduce_coalesced(tensors: Callable[[], list[torch.Tensor]]
                         ) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        return lambda: _backend(dist).allreduce_coalesced(
            tensors(), _opts(dist, "AllreduceCoalescedOptions"))
    return build


def _scatter(root: Callable[[int, int], int],
             outputs: Callable[[int], list[torch.Tensor]],
             inputs: Callable[[int], list[list[torch.Tensor]]]) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        opts = _opts(dist, "ScatterOptions", rootRank=root(rank, world))
        return lambda: _backend(dist).scatter(outputs(world), inputs(world), opts)
    return build


def _gather(root: Callable[[int, int], int],
            outputs: Callable[[int], list[list[torch.Tensor]]],
            inputs: Callable[[int], list[torch.Tensor]]) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        opts = _opts(dist, "GatherOptions", rootRank=root(rank, world))
        return lambda: _backend(dist).gather(outputs(world), inputs(world), opts)
    return build


def _allgather(outputs: Callable[[int], list[list[torch.Tensor]]],
               inputs: Callable[[int], list[torch.Tensor]]) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        return lambda: _backend(dist).allgather(outputs(world), inputs(world))
    return build


def _reduce(root: Callable[[int, int], int], root_tensor: int,
            tensors: Callable[[], list[torch.Tensor]]) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        opts = _opts(dist, "ReduceOptions", rootRank=root(rank, world), rootTensor=root_tensor)
        return lambda: _backend(dist).reduce(tensors(), opts)
    return build


def _all_gather_coalesced(kind: str) -> Callable[[Any, int, int], Thunk]:
    """``all_gather_coalesced`` (the function) on the default group with one bad output:
    output list 0 holds an empty tensor ("size"), a float64 one ("type"), there is one output
    list too many ("lists"), or the outputs are not a list of lists ("flat")."""
    def build(dist: Any, rank: int, world: int) -> Thunk:
        outputs: list[Any] = [[_t1()] for _ in range(world)]
        if kind == "size":
            outputs[0] = [torch.zeros([0], dtype=torch.float32)]
        elif kind == "type":
            outputs[0] = [torch.zeros([1], dtype=torch.float64)]
        elif kind == "lists":
            outputs = [[_t1()] for _ in range(world + 1)]
        elif kind == "flat":
            outputs = [torch.zeros([0], dtype=torch.float32)]
        return lambda: dist.all_gather_coalesced(outputs, [_t1()], dist.group.WORLD)
    return build


def _own(rank: int, world: int) -> int:
    return rank


def _next(rank: int, world: int) -> int:
    return (rank + 1) % world


def _minus_one(rank: int, world: int) -> int:
    return -1


def _world(rank: int, world: int) -> int:
    return world


def _zero(rank: int, world: int) -> int:
    return 0


_W = (2, 3)  # the world sizes of the backend checks

BACKEND_CHECKS: dict[str, Check] = {
    # test_broadcast_checks
    "broadcast_root_rank_negative": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid root rank", _W,
        _broadcast(_minus_one, 0, lambda: [_t1()])),
    "broadcast_root_rank_world": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid root rank", _W,
        _broadcast(_world, 0, lambda: [_t1()])),
    "broadcast_root_tensor_negative": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid root tensor", _W,
        _broadcast(_own, -1, lambda: [_t1()])),
    "broadcast_root_tensor_past_end": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid root tensor", _W,
        _broadcast(_own, 1, lambda: [_t1()])),
    "broadcast_no_tensors": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid root tensor", _W,
        _broadcast(_own, 0, lambda: [])),
    "broadcast_tensor_type": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid tensor type", _W,
        _broadcast(_own, 0, lambda: [_t1(), _t2()])),
    "broadcast_tensor_size": Check(
        f"{GLOO}::test_broadcast_checks", RuntimeError, "invalid tensor size", _W,
        _broadcast(_own, 0, lambda: [_t1(), _t3()])),
    # test_allreduce_checks (its empty-list assertion is repeated by test_sparse_allreduce_checks)
    "allreduce_no_tensors": Check(
        f"{GLOO}::test_allreduce_checks", RuntimeError, "requires non-empty tensor list", _W,
        _allreduce(lambda: [])),
    "allreduce_tensor_type": Check(
        f"{GLOO}::test_allreduce_checks", RuntimeError, "invalid tensor type", _W,
        _allreduce(lambda: [_t1(), _t2()])),
    "allreduce_tensor_size": Check(
        f"{GLOO}::test_allreduce_checks", RuntimeError, "invalid tensor size", _W,
        _allreduce(lambda: [_t1(), _t3()])),
    # test_allreduce_coalesced_checks
    "allreduce_coalesced_no_tensors": Check(
        f"{GLOO}::test_allreduce_coalesced_checks", RuntimeError,
        "requires non-empty tensor list", _W, _allreduce_coalesced(lambda: [])),
    "allreduce_coalesced_tensor_type": Check(
        f"{GLOO}::test_allreduce_coalesced_checks", RuntimeError,
        "tensors must all have the same type", _W, _allreduce_coalesced(lambda: [_t1(), _t2()])),
    "allreduce_coalesced_layout": Check(
        f"{GLOO}::test_allreduce_coalesced_checks", RuntimeError,
        "invalid tensor layout at index", _W,
        _allreduce_coalesced(lambda: [_t1(), torch.sparse_coo_tensor([[0]], [1], size=(1,))])),
    "allreduce_coalesced_sparse": Check(
        f"{GLOO}::test_allreduce_coalesced_checks", RuntimeError, "unsupported layout", _W,
        _allreduce_coalesced(lambda: [_sparse(1), _sparse(1)])),
    # test_sparse_allreduce_checks
    "sparse_allreduce_layout": Check(
        f"{GLOO}::test_sparse_allreduce_checks", RuntimeError, "invalid tensor layout", _W,
        _allreduce(lambda: [torch.zeros([1]), _sparse(2)])),
    "sparse_allreduce_size": Check(
        f"{GLOO}::test_sparse_allreduce_checks", RuntimeError, "invalid tensor size", _W,
        _allreduce(lambda: [_sparse(2), _sparse(4)])),
    **{
        f"sparse_allreduce_op_{op}": Check(
            f"{GLOO}::test_sparse_allreduce_checks", RuntimeError,
            "unsupported reduction operation", _W, _allreduce(lambda: [_sparse(4)], op))
        for op in ("PRODUCT", "MIN", "MAX")
    },
    # test_scatter_checks
    "scatter_root_rank_negative": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "invalid root rank", _W,
        _scatter(_minus_one, lambda w: [_t1()], lambda w: [])),
    "scatter_root_rank_world": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "invalid root rank", _W,
        _scatter(_world, lambda w: [_t1()], lambda w: [])),
    "scatter_no_output": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError,
        "requires a single-element output tensor list", _W,
        _scatter(_zero, lambda w: [], lambda w: [])),
    "scatter_two_outputs": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError,
        "requires a single-element output tensor list", _W,
        _scatter(_zero, lambda w: [_t1(), _t1()], lambda w: [])),
    "scatter_no_input_list": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "requires a single-element input list",
        _W, _scatter(_own, lambda w: [_t1()], lambda w: [])),
    "scatter_two_input_lists": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "requires a single-element input list",
        _W, _scatter(_own, lambda w: [_t1()], lambda w: [[_t1()] * w, [_t1()] * w])),
    "scatter_input_list_short": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError,
        "Incorrect input list size {short}. Input list size should be {world}", _W,
        _scatter(_own, lambda w: [_t1()], lambda w: [[_t1()] * (w - 1)])),
    "scatter_input_list_long": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError,
        "Incorrect input list size {long}. Input list size should be {world}", _W,
        _scatter(_own, lambda w: [_t1()], lambda w: [[_t1()] * (w + 1)])),
    "scatter_tensor_type": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "invalid tensor type", _W,
        _scatter(_own, lambda w: [_t1()], lambda w: [[_t2()] * w])),
    "scatter_tensor_size": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "invalid tensor size", _W,
        _scatter(_own, lambda w: [_t1()], lambda w: [[_t3()] * w])),
    "scatter_input_on_non_root": Check(
        f"{GLOO}::test_scatter_checks", RuntimeError, "requires empty input on non-root", _W,
        _scatter(_next, lambda w: [_t1()], lambda w: [[_t1()] * w])),
    # test_gather_checks
    "gather_root_rank_negative": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "invalid root rank", _W,
        _gather(_minus_one, lambda w: [], lambda w: [_t1()])),
    "gather_root_rank_world": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "invalid root rank", _W,
        _gather(_world, lambda w: [], lambda w: [_t1()])),
    "gather_no_input": Check(
        f"{GLOO}::test_gather_checks", RuntimeError,
        "requires a single-element input tensor list", _W,
        _gather(_zero, lambda w: [], lambda w: [])),
    "gather_two_inputs": Check(
        f"{GLOO}::test_gather_checks", RuntimeError,
        "requires a single-element input tensor list", _W,
        _gather(_zero, lambda w: [], lambda w: [_t1(), _t1()])),
    "gather_no_output_list": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "requires a single-element output list",
        _W, _gather(_own, lambda w: [], lambda w: [_t1()])),
    "gather_two_output_lists": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "requires a single-element output list",
        _W, _gather(_own, lambda w: [[_t1()] * w, [_t1()] * w], lambda w: [_t1()])),
    "gather_output_list_short": Check(
        f"{GLOO}::test_gather_checks", RuntimeError,
        "Incorrect output list size {short}. Output list size should be {world}", _W,
        _gather(_own, lambda w: [[_t1()] * (w - 1)], lambda w: [_t1()])),
    "gather_output_list_long": Check(
        f"{GLOO}::test_gather_checks", RuntimeError,
        "Incorrect output list size {long}. Output list size should be {world}", _W,
        _gather(_own, lambda w: [[_t1()] * (w + 1)], lambda w: [_t1()])),
    "gather_tensor_type": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "invalid tensor type", _W,
        _gather(_own, lambda w: [[_t2()] * w], lambda w: [_t1()])),
    "gather_tensor_size": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "invalid tensor size", _W,
        _gather(_own, lambda w: [[_t3()] * w], lambda w: [_t1()])),
    "gather_output_on_non_root": Check(
        f"{GLOO}::test_gather_checks", RuntimeError, "requires empty output on non-root", _W,
        _gather(_next, lambda w: [[_t1()] * w], lambda w: [_t1()])),
    # test_allgather_checks
    "allgather_no_input": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "requires non-empty input tensor list",
        _W, _allgather(lambda w: [], lambda w: [])),
    "allgather_no_output_list": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError,
        "requires input/output tensor lists to have the same length", _W,
        _allgather(lambda w: [], lambda w: [_t1()])),
    "allgather_two_output_lists": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError,
        "requires input/output tensor lists to have the same length", _W,
        _allgather(lambda w: [[_t1()] * w, [_t1()] * w], lambda w: [_t1()])),
    "allgather_output_list_short": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid output tensor list", _W,
        _allgather(lambda w: [[_t1()] * (w - 1)], lambda w: [_t1()])),
    "allgather_output_list_long": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid output tensor list", _W,
        _allgather(lambda w: [[_t1()] * (w + 1)], lambda w: [_t1()])),
    "allgather_input_type": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid tensor type", _W,
        _allgather(lambda w: [[_t1(), _t1()] * w, [_t1(), _t1()] * w],
                   lambda w: [_t1(), _t2()])),
    "allgather_input_size": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid tensor size", _W,
        _allgather(lambda w: [[_t1(), _t1()] * w, [_t1(), _t1()] * w],
                   lambda w: [_t1(), _t3()])),
    "allgather_output_type": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid tensor type", _W,
        _allgather(lambda w: [([_t1(), _t2()] * w)[:w]], lambda w: [_t1()])),
    # torch's output-size assertion gives rank 0 its own block right and only the others a
    # wrong one; rustdist's all_gather takes blocks of other sizes (uneven all_gather), so
    # only a rank whose own block has another size than its input can tell. Here every rank's
    # does (every block has two elements for an input of one).
    "allgather_output_size": Check(
        f"{GLOO}::test_allgather_checks", RuntimeError, "invalid tensor size", _W,
        _allgather(lambda w: [[_t3()] * w], lambda w: [_t1()])),
    # test_allgather_coalesced_checks (the function, with the group)
    "all_gather_coalesced_output_size": Check(
        f"{GLOO}::test_allgather_coalesced_checks", RuntimeError,
        "invalid size of output tensor at index 0", _W, _all_gather_coalesced("size")),
    "all_gather_coalesced_output_type": Check(
        f"{GLOO}::test_allgather_coalesced_checks", RuntimeError,
        "invalid tensor type at index 0", _W, _all_gather_coalesced("type")),
    "all_gather_coalesced_output_lists": Check(
        f"{GLOO}::test_allgather_coalesced_checks", RuntimeError,
        "output lists should be equal to world size", _W, _all_gather_coalesced("lists")),
    "all_gather_coalesced_not_nested": Check(
        f"{GLOO}::test_allgather_coalesced_checks", TypeError,
        "Invalid function argument.*output_tensor_lists", _W, _all_gather_coalesced("flat")),
    # test_reduce_checks
    "reduce_root_rank_negative": Check(
        f"{GLOO}::test_reduce_checks", RuntimeError, "invalid root rank", _W,
        _reduce(_minus_one, 0, lambda: [_t1()])),
    "reduce_root_rank_world": Check(
        f"{GLOO}::test_reduce_checks", RuntimeError, "invalid root rank", _W,
        _reduce(_world, 0, lambda: [_t1()])),
    "reduce_root_tensor": Check(
        f"{GLOO}::test_reduce_checks", RuntimeError, "invalid root tensor", _W,
        _reduce(_own, 1, lambda: [_t1()])),
    "reduce_two_tensors": Check(
        f"{GLOO}::test_reduce_checks", RuntimeError, "requires a single-element tensor list",
        _W, _reduce(_own, 0, lambda: [_t1(), _t1()])),
}


# ---------------------------------------------------------------------------------------------
# torch.distributed's functions (test_c10d_common.py, distributed_test.py)


def _dtype_mismatch(call: str) -> Callable[[Any, int, int], Thunk]:
    """One call of torch's dtype-mismatch assertions: a float32 tensor, its float16 copy, a
    list of world-size float32 tensors and its copy whose entry 1 is float16."""
    def build(dist: Any, rank: int, world: int) -> Thunk:
        tensor = torch.ones(2, 2) * 7
        tensor_h = tensor.half()
        tensors = [torch.zeros(2, 2) for _ in range(world)]
        tensors_h = list(tensors)
        tensors_h[1] = tensors_h[1].half()
        calls: dict[str, Thunk] = {
            "all_gather_list": lambda: dist.all_gather(tensors_h, tensor),
            "all_gather_input": lambda: dist.all_gather(tensors, tensor_h),
            "all_gather_coalesced": lambda: dist.all_gather_coalesced([tensors_h], tensors),
            "all_reduce_coalesced": lambda: dist.all_reduce_coalesced(tensors_h),
            "reduce_scatter_list": lambda: dist.reduce_scatter(tensor, tensors_h),
            "reduce_scatter_output": lambda: dist.reduce_scatter(tensor_h, tensors),
            "all_to_all_single": lambda: dist.all_to_all_single(tensor_h, tensor),
            "all_to_all_output": lambda: dist.all_to_all(tensors_h, tensors),
            "all_to_all_input": lambda: dist.all_to_all(tensors, tensors_h),
            "scatter_list": lambda: dist.scatter(tensor, tensors_h),
            "gather_input": lambda: dist.gather(tensor_h, tensors),
            "gather_list": lambda: dist.gather(tensor, tensors_h),
            "scatter_output": lambda: dist.scatter(tensor_h, tensors),
        }
        return calls[call]
    return build


DTYPE_CALLS = ("all_gather_list", "all_gather_input", "all_gather_coalesced",
               "all_reduce_coalesced", "reduce_scatter_list", "reduce_scatter_output",
               "all_to_all_single", "all_to_all_output", "all_to_all_input", "scatter_list",
               "gather_input", "gather_list", "scatter_output")


class _UnregisteredGroup(torch.distributed.ProcessGroup):
    """A process group no ``new_group`` made (torch's test uses a Python one like this)."""


def _membership(fn: str, rank_arg: int, registered: bool) -> Callable[[Any, int, int], Thunk]:
    """``get_group_rank`` / ``get_global_rank`` of a rank outside the group made of rank 1
    (which every rank creates), or on a group that was never registered."""
    def build(dist: Any, rank: int, world: int) -> Thunk:
        group = dist.new_group(ranks=[1]) if registered else _UnregisteredGroup(rank, world)
        return lambda: getattr(dist, fn)(group, rank_arg)
    return build


def _send_recv(kind: str) -> Callable[[Any, int, int], Thunk]:
    """The send/recv argument errors torch raises before any backend call."""
    def build(dist: Any, rank: int, world: int) -> Thunk:
        t = torch.zeros(2, 2)
        calls: dict[str, Thunk] = {
            "send_to_self": lambda: dist.send(t, dist.get_rank()),
            "send_group_dst_self": lambda: dist.send(t, group_dst=dist.get_rank()),
            "send_both_dst": lambda: dist.send(t, dist.get_rank(), group_dst=dist.get_rank()),
            "send_no_dst": lambda: dist.send(t),
            "recv_both_src": lambda: dist.recv(t, src=0, group_src=0),
        }
        return calls[kind]
    return build


def _complex_all_reduce(op: str) -> Callable[[Any, int, int], Thunk]:
    def build(dist: Any, rank: int, world: int) -> Thunk:
        t = torch.ones(1, dtype=torch.cfloat)
        return lambda: dist.all_reduce(t, getattr(dist.ReduceOp, op), dist.group.WORLD)
    return build


def _build_simple(fn: Callable[[Any, int, int], Any]) -> Callable[[Any, int, int], Thunk]:
    """A builder for a call that needs no setup."""
    return lambda dist, rank, world: (lambda: fn(dist, rank, world))


class _Unpicklable:
    """Objects of a class defined inside a function cannot be pickled (AttributeError)."""


def _unpicklable() -> Any:
    class Local(_Unpicklable):
        pass

    return Local()


def _mixed_groups(dist: Any, rank: int, world: int) -> Thunk:
    """Two P2POps on two different groups (of the same ranks) in one batch."""
    a = dist.new_group(ranks=list(range(world)))
    b = dist.new_group(ranks=list(range(world)))
    peer = (rank + 1) % world
    t = torch.ones(1)
    return lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer, a),
                                           dist.P2POp(dist.isend, t, peer, b)])


FUNCTION_CHECKS: dict[str, Check] = {
    # test_c10d_common.py
    **{
        f"dtype_mismatch_{call}": Check(
            f"{COMMON}::AbstractCommTest::_test_tensor_dtype_mismatch", ValueError,
            "tensors with different dtypes", (2,), _dtype_mismatch(call))
        for call in DTYPE_CALLS
    },
    "all_to_all_single_non_contiguous": Check(
        f"{COMMON}::ProcessGroupWithDispatchedCollectivesTests::_test_all_to_all_single",
        ValueError, "Tensors must be contiguous", (1, 2),
        _build_simple(lambda dist, rank, world: dist.all_to_all_single(
            torch.zeros(2 * world, 2), torch.ones(2, 2 * world).t()))),
    "group_rank_not_in_group": Check(
        f"{COMMON}::AbstractCommTest::_test_rank_membership", ValueError, "not part of group",
        (2,), _membership("get_group_rank", 0, True)),
    "group_rank_unregistered": Check(
        f"{COMMON}::AbstractCommTest::_test_rank_membership", ValueError, "not registered",
        (2,), _membership("get_group_rank", 0, False)),
    "global_rank_not_in_group": Check(
        f"{COMMON}::AbstractCommTest::_test_rank_membership", ValueError, "not part of group",
        (2,), _membership("get_global_rank", 1, True)),
    "global_rank_unregistered": Check(
        f"{COMMON}::AbstractCommTest::_test_rank_membership", ValueError, "not registered",
        (2,), _membership("get_global_rank", 0, False)),
    **{
        kind: Check(f"{COMMON}::PythonProcessGroupExtensionTest::test_send_recv", ValueError,
                    "", (2,), _send_recv(kind))
        for kind in ("send_to_self", "send_group_dst_self", "send_both_dst", "send_no_dst",
                     "recv_both_src")
    },
    # distributed_test.py
    "get_backend_not_in_group": Check(
        f"{DIST}::test_get_backend", ValueError, "Invalid process group specified", (3,),
        lambda dist, rank, world: _get_backend_outside(dist, rank, world)),
    **{
        f"backend_enum_{name}": Check(f"{DIST}::test_Backend_enum_class", ValueError, "", (1,),
                                      _build_simple(lambda dist, r, w, v=value: dist.Backend(v)))
        for name, value in (("none", None), ("int", 3), ("list", ["gloo"]))
    },
    "new_subgroups_too_large": Check(
        f"{DIST}::test_new_subgroups_group_size_exceeds_world_size", ValueError,
        "must not exceed", (1, 2), _build_simple(lambda dist, r, w: dist.new_subgroups(100))),
    "new_subgroups_not_divisible": Check(
        f"{DIST}::test_new_subgroups_world_size_not_divisible_by_group_size", ValueError,
        re.escape("The world size (4) must be divisible by 'group_size=3'"), (4,),
        _build_simple(lambda dist, r, w: dist.new_subgroups(3))),
    "subgroups_rank_past_world": Check(
        f"{DIST}::test_new_subgroups_by_enumeration_input_rank_exceeds_world_size", ValueError,
        "Rank {world} is out of range", (4,),
        _build_simple(lambda dist, r, w: dist.new_subgroups_by_enumeration(
            ranks_per_subgroup_list=[[0, 1], [w, 2]]))),
    "subgroups_negative_rank": Check(
        f"{DIST}::test_new_subgroups_by_enumeration_negative_input_rank", ValueError,
        r"Rank -\d+ is out of range", (2, 4),
        _build_simple(lambda dist, r, w: dist.new_subgroups_by_enumeration(
            ranks_per_subgroup_list=[[-1, -2], [-3, -4]]))),
    "subgroups_overlap": Check(
        f"{DIST}::test_new_subgroups_overlap_not_allowed", ValueError,
        "Rank 1 has appeared in both subgroup", (4,),
        _build_simple(lambda dist, r, w: dist.new_subgroups_by_enumeration(
            ranks_per_subgroup_list=[[0], [1, 2], [1, 3]]))),
    "batch_isend_irecv_invalid_op": Check(
        f"{DIST}::test_batch_isend_irecv_op_err", ValueError, "^Invalid ``op``", (2,),
        _build_simple(lambda dist, r, w: dist.batch_isend_irecv(
            [dist.P2POp(dist.broadcast, torch.ones(1), (r + 1) % w)]))),
    "batch_isend_irecv_invalid_list": Check(
        f"{DIST}::test_batch_isend_irecv_op_list_err", ValueError, "^Invalid ``p2p_op_list``",
        (2,), _build_simple(lambda dist, r, w: dist.batch_isend_irecv([1, 2]))),
    "batch_isend_irecv_two_groups": Check(
        f"{DIST}::test_batch_isend_irecv_mixed_backend_err", ValueError,
        "All ops need to use the same group", (2,), _mixed_groups),
    **{
        f"complex_all_reduce_{op}": Check(
            f"{DIST}::test_all_reduce_complex_unsupported_ops", ValueError,
            "all_reduce does not support", (1, 2), _complex_all_reduce(op))
        for op in ("MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR")
    },
    "complex_all_reduce_coalesced_max": Check(
        f"{DIST}::test_all_reduce_coalesced_max_complex_unsupported", ValueError,
        "all_reduce does not support", (1, 2),
        _build_simple(lambda dist, r, w: dist.all_reduce_coalesced(
            [torch.ones(1, dtype=torch.cfloat)], dist.ReduceOp.MAX, dist.group.WORLD))),
    "all_gather_object_unpicklable": Check(
        f"{DIST}::_test_gather_object (all_gather_object of a local class)", AttributeError,
        "", (2,), _build_simple(lambda dist, r, w: dist.all_gather_object(
            [None] * w, _unpicklable()))),
    "scatter_object_list_empty_output": Check(
        f"{DIST}::test_scatter_object_list", ValueError,
        "Expected argument scatter_object_output_list to be a list of size at least 1.", (2,),
        _build_simple(lambda dist, r, w: dist.scatter_object_list([], [1] * w, src=0))),
}


def _get_backend_outside(dist: Any, rank: int, world: int) -> Thunk:
    """``get_backend`` of the group of ranks 1 and 2, which every rank creates; rank 0 is
    outside it (the members get the backend's name, checked here too)."""
    group = dist.new_group([1, 2])
    if rank == 0:
        return lambda: dist.get_backend(group)
    assert dist.get_backend(group) == ctx.backend.lower(), dist.get_backend(group)
    raise _NotThisRank()


class _NotThisRank(Exception):
    """Raised by a builder on a rank that the assertion is not about."""


CHECKS: dict[str, Check] = {**BACKEND_CHECKS, **FUNCTION_CHECKS}


def case_check(dist: Any, rank: int, world: int, check: str) -> None:
    """Runs ``CHECKS[check]`` on this rank, then a sanity all_reduce."""
    entry = CHECKS[check]
    regex = entry.regex.format(world=world, short=world - 1, long=world + 1)
    try:
        call = entry.build(dist, rank, world)
    except _NotThisRank:
        call = None
    if call is not None:
        expect(entry.kind, regex, call, f"{check} ({entry.source}) on rank {rank}")
    sanity(dist, world)


# ---------------------------------------------------------------------------------------------
# Cases in which the ranks differ


def case_node_local_rank(dist: Any, rank: int, world: int) -> None:
    """test_c10d_common.py::LocalRankTest::testWithoutEnv: ``get_node_local_rank()`` without
    LOCAL_RANK in the environment raises RuntimeError naming it."""
    saved = os.environ.pop("LOCAL_RANK", None)
    try:
        expect(RuntimeError, "LOCAL_RANK", lambda: dist.get_node_local_rank(),
               "get_node_local_rank() without LOCAL_RANK")
    finally:
        if saved is not None:
            os.environ["LOCAL_RANK"] = saved


def case_backend_config_invalid(dist: Any, rank: int, world: int) -> None:
    """test_c10d_common.py::PythonProcessGroupExtensionTest::test_backend_config: a backend
    string with a trailing comma or a device named twice makes ``BackendConfig`` raise
    ValueError."""
    for spec in ("cpu:gloo,cuda:nccl,", "cpu:gloo,cuda:nccl,cpu:dummy", "cpu:gloo,xpu:xccl,",
                 "cpu:gloo,xpu:xccl,cpu:dummy"):
        expect(ValueError, "", lambda: dist.BackendConfig(spec), f"BackendConfig({spec!r})")


def case_debug_level_invalid(dist: Any, rank: int, world: int) -> None:
    """test_c10d_common.py::CommTest::test_debug_level: an invalid TORCH_DISTRIBUTED_DEBUG makes
    ``set_debug_level_from_env()`` raise ValueError (the level is left as it was)."""
    saved = os.environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    try:
        for value in ("foo", 0, 1, -1):
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = str(value)
            expect(ValueError, "The value of TORCH_DISTRIBUTED_DEBUG must",
                   lambda: dist.set_debug_level_from_env(),
                   f"set_debug_level_from_env() with TORCH_DISTRIBUTED_DEBUG={value}")
    finally:
        if saved is None:
            del os.environ["TORCH_DISTRIBUTED_DEBUG"]
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = saved
        dist.set_debug_level_from_env()
    assert dist.get_debug_level() == dist.DebugLevel.OFF, dist.get_debug_level()


def case_store_get_timeout(dist: Any, rank: int, world: int) -> None:
    """test_c10d_common.py::AbstractTimeoutTest::_test_store_timeout: ``get`` of a key nobody
    sets on the default store raises RuntimeError saying it timed out (after the store's
    timeout, set to 1 s here as torch's test initialises with ``timeout=1s``)."""
    store = dist.distributed_c10d._get_default_store()
    saved = store.timeout
    store.set_timeout(timedelta(seconds=1))
    try:
        expect(RuntimeError, "(?i)timeout", lambda: store.get(f"nonexistent key {rank}"),
               "store.get of a key nobody sets")
    finally:
        store.set_timeout(saved)
    sanity(dist, world)


def case_barrier_timeout(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::_test_barrier_timeout (test_barrier_timeout_group,
    _full_group, _global): a barrier only rank 0 enters, on a group with a 1 s timeout,
    raises an Exception saying " Timed out ", " closed " or " timeout ". The others wait for
    rank 0 at a barrier of the default group, then every rank destroys the group."""
    group = dist.new_group(ranks=list(range(world)), timeout=timedelta(seconds=1))
    if rank == 0:
        expect(Exception, " (Timed out|closed|timeout) ", lambda: dist.barrier(group),
               "barrier of a group with a 1 s timeout entered by rank 0 alone")
    dist.barrier()
    dist.destroy_process_group(group)
    sanity(dist, world)


def case_barrier_timeout_arg(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_barrier_timeout_arg: barrier(timeout=1 ms) on a group with a
    300 s timeout, entered by rank 0 alone, raises RuntimeError "Timed out waiting 1ms".
    rustdist's barrier is still waiting for the others then (as any Work whose wait timed
    out), so this runs in a world of its own that ends with the test."""
    group = dist.new_group(ranks=list(range(world)), timeout=timedelta(seconds=300))
    if rank == 0:
        expect(RuntimeError, "Timed out waiting 1ms",
               lambda: dist.barrier(group=group, timeout=timedelta(seconds=0.001)),
               "barrier(timeout=1 ms) entered by rank 0 alone")


def _monitored(dist: Any, world: int, calls: Callable[[Any], None]) -> None:
    """``calls(group)`` on a new group of every rank (a monitored barrier that fails leaves
    gloo's pairs of its group closed), then a barrier of the default group so that no rank
    destroys the group before rank 0 is done with it, then the group's end."""
    group = dist.new_group(ranks=list(range(world)))
    calls(group)
    dist.barrier()
    dist.destroy_process_group(group)
    sanity(dist, world)


def case_monitored_barrier_failed_rank(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_monitored_barrier_gloo: rank 1 skips the monitored barrier;
    rank 0 raises naming it, every other caller raises saying it reached the barrier but got
    an error from rank 0."""
    timeout = timedelta(seconds=2)

    def calls(group: Any) -> None:
        if rank == 0:
            expect(RuntimeError, "Rank 1 failed to pass monitoredBarrier",
                   lambda: dist.monitored_barrier(group, timeout=timeout), "rank 0")
        elif rank != 1:
            expect(RuntimeError, f"Rank {rank} successfully reached monitoredBarrier, but "
                   "received errors while waiting for send/recv from rank 0",
                   lambda: dist.monitored_barrier(group, timeout=timeout), f"rank {rank}")

    _monitored(dist, world, calls)


def case_monitored_barrier_subgroup(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_monitored_barrier_gloo_subgroup: on the group of ranks 0 and
    1, rank 1 skips the monitored barrier; rank 0 raises naming it; ranks outside the group
    return at once."""
    subgroup = dist.new_group(ranks=[0, 1])
    if rank == 0:
        expect(RuntimeError, "Rank 1 failed to pass monitoredBarrier",
               lambda: dist.monitored_barrier(subgroup, timedelta(seconds=0.1)), "rank 0")
    elif rank != 1:
        assert dist.monitored_barrier(subgroup, timedelta(seconds=0.1)) is None
    sanity(dist, world)


def case_monitored_barrier_rank0_timeout(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_monitored_barrier_gloo_rank_0_timeout: the group's own
    ``monitored_barrier(timeout=0)``, called by rank 0 alone, raises "Rank 0 timed out in
    monitoredBarrier"."""
    group = dist.new_group(ranks=list(range(world)))
    if rank == 0:
        expect(RuntimeError, "Rank 0 timed out in monitoredBarrier",
               lambda: group.monitored_barrier(timedelta(seconds=0)), "rank 0")
    sanity(dist, world)


def case_monitored_barrier_failure_order(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_monitored_barrier_failure_order: ranks 2 and up skip; rank 0
    names rank 2 first, rank 1 says it reached the barrier but got an error from rank 0."""
    timeout = timedelta(seconds=2)

    def calls(group: Any) -> None:
        if rank == 0:
            expect(RuntimeError, "Rank 2", lambda: dist.monitored_barrier(group, timeout=timeout),
                   "rank 0")
        elif rank == 1:
            expect(RuntimeError, "Rank 1 successfully reached monitoredBarrier, but received "
                   "errors while waiting for send/recv from rank 0",
                   lambda: dist.monitored_barrier(group, timeout=timeout), "rank 1")

    _monitored(dist, world, calls)


def case_monitored_barrier_wait_all_ranks(dist: Any, rank: int, world: int) -> None:
    """distributed_test.py::test_monitored_barrier_wait_all_ranks: rank 0 alone calls with
    ``wait_all_ranks=True`` and names every other rank."""
    def calls(group: Any) -> None:
        if rank == 0:
            ranks = ", ".join(str(r) for r in range(1, world))
            expect(RuntimeError, f"Ranks {ranks} failed to pass monitoredBarrier",
                   lambda: dist.monitored_barrier(group, timeout=timedelta(seconds=0.1),
                                                  wait_all_ranks=True), "rank 0")

    _monitored(dist, world, calls)
