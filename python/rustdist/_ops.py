"""One body per operation, on a resolved group: the argument checks the engine cannot make,
DETAIL mode's cross-rank check, calls whose tensors share memory (``_alias``), and the call
into the engine, or into ``rustdist.cuda`` when the deciding tensor is a CUDA tensor.

Both front doors end here: ``distributed_c10d`` after resolving ``group=`` and the peers'
ranks, the torch door's group methods on ``self``. ``pg`` is a member's rustdist group; ranks
are group ranks; a synchronous call (``async_op=False``) returns None once done, an
asynchronous one its ``Work``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

from . import _core, _debug, _sparse, cuda
from ._alias import READ, UPDATE, WRITE, Staged, unalias
from ._reduce_op import ReduceOp, op_args, supports_complex
from ._tensor import (
    _TORCH_CODES, COMPLEX_CODES, ITEMSIZE, SparseInput, buffer, concat, dim0, routed,
)
from ._profiling import Spec, profiled
from ._work import Work, seconds

_SUM = ReduceOp.SUM


def _detail(pg: Any, name: str, code: Optional[int], shapes: Optional[list[Any]],
            op: Optional[int] = None, root: Optional[int] = None) -> None:
    """DETAIL debug mode: all ranks must agree on the collective's arguments."""
    _debug.check_collective(pg._pg, pg._ranks, name, code, shapes, op, root)


def _reduce_args(op: Any, code: int, name: str) -> tuple[int, Optional[float]]:
    """The engine's op code and PREMUL_SUM factor of ``op`` on tensors of dtype ``code``."""
    if op is _SUM:  # the default, on the hot path: defined for every dtype
        return 0, None
    opc, premul = op_args(op)
    if code in COMPLEX_CODES and not supports_complex(opc):
        raise ValueError(f"{name} does not support {op} on complex tensors")
    return opc, premul


def _cuda_reduce_args(op: Any, tensor: Any, name: str) -> tuple[int, Optional[float]]:
    return _reduce_args(op, _TORCH_CODES[tensor.dtype], name)


def _same_dtype(code: int, other: int, t: Any, first: Any) -> None:
    if other != code:
        raise ValueError(
            f"Invalid usage of tensors with different dtypesFound {first.dtype} and  {t.dtype}"
        )


def _numel(x: Any) -> int:
    """The element count of a torch tensor or numpy array."""
    return x.numel() if callable(getattr(x, "numel", None)) else x.size


def _finish(work: Any, outputs: list[Any], async_op: bool) -> Optional[Work]:
    """The Work of an asynchronous call; a synchronous one has run already (the engine ran it
    with ``sync``) or, for several engine Works, is waited for here."""
    if async_op:
        return Work(work, outputs)
    if work is not None:
        work.wait()
    return None


def _finish_cuda(works: list[Any], async_op: bool) -> Optional[Work]:
    """Several CUDA operations as one: they run in order on the group's internal stream, so
    the last one's end is the end of all."""
    last = works[-1] if works else None
    if async_op or last is None:
        return last
    last.wait()
    return None


def joined(works: list[Any], outputs: list[Any], async_op: bool) -> Optional[Work]:
    """Several operations' Works (CPU or CUDA, from calls made with ``async_op=True``) as
    one call's."""
    if works and isinstance(works[-1], cuda.CudaWork):
        return _finish_cuda(works, async_op)
    return _finish(_core.join([w._work for w in works if w is not None]), outputs, async_op)


def _staged(st: Staged, run: Callable[[list[Any]], Any], outputs: list[Any],
            async_op: bool) -> Optional[Work]:
    """Runs a call whose tensors share memory on ``st.tensors`` (``run`` starts it with
    ``async_op=True`` and returns its Work, or a list of Works) and copies the private buffers
    back into the call's tensors once it has succeeded: CPU ones by the engine before the
    Work completes, CUDA ones on the current stream when the Work is waited for."""
    started = run(st.tensors)
    works = started if isinstance(started, list) else [started]
    if getattr(st.tensors[0], "is_cuda", False):
        return cuda.staged(works, st.back, outputs, async_op)
    work = _core.join([w._work for w in works], st.copies(), (st.tensors, outputs))
    return _finish(work, outputs, async_op)


# ---------------------------------------------------------------------------------------------
# Reductions and broadcast


@profiled(Spec("all_reduce", "tensor", "tensor"))
def all_reduce(pg: Any, tensor: Any, op: Any, async_op: bool) -> Optional[Work]:
    """``tensor`` reduced over the group, in place; sparse COO tensors summed as gloo does."""
    try:
        buf = routed(tensor, "tensor", True)
    except SparseInput:  # a sparse COO tensor: summed as gloo sums it, in place
        _sparse.all_reduce(tensor, op, pg._size,
                           lambda out, inp: all_gather_into_tensor(pg, out, inp, False),
                           lambda outs, inp: all_gather(pg, outs, inp, False))
        return Work(_core.join([]), [tensor]) if async_op else None
    if buf is None:
        opc, premul = _cuda_reduce_args(op, tensor, "all_reduce")
        return cuda.all_reduce(pg, tensor, opc, premul, async_op)
    ptr, n, code = buf
    opc, premul = _reduce_args(op, code, "all_reduce")
    if _debug.detail:
        _detail(pg, "all_reduce", code, [tensor.shape], opc)
    if async_op:
        return Work(pg._pg.all_reduce(ptr, n, code, opc, tensor, premul), [tensor])
    pg._pg.all_reduce(ptr, n, code, opc, None, premul, True)
    return None


@profiled(Spec("all_reduce_coalesced", "tensors", "tensors"))
def all_reduce_coalesced(pg: Any, tensors: list[Any], op: Any,
                         async_op: bool) -> Optional[Work]:
    """Each of ``tensors`` (one dtype) reduced over the group, as one call."""
    st = unalias(tensors, [UPDATE] * len(tensors))
    if st is not None:  # a tensor listed twice is reduced once, as gloo's flat buffer does
        return _staged(st, lambda ts: all_reduce_coalesced(pg, ts, op, True), tensors,
                       async_op)
    if tensors and getattr(tensors[0], "is_cuda", False):
        # One internal stream runs them in order: the last one's end is the end of all.
        opc, premul = _cuda_reduce_args(op, tensors[0], "all_reduce")
        return _finish_cuda([cuda.all_reduce(pg, t, opc, premul, True) for t in tensors],
                            async_op)
    bufs = [buffer(t, "tensor", True) for t in tensors]
    for (_, _, c), t in zip(bufs, tensors):
        _same_dtype(bufs[0][2], c, t, tensors[0])
    if not bufs:
        return Work(_core.join([]), []) if async_op else None
    opc, premul = _reduce_args(op, bufs[0][2], "all_reduce")
    if _debug.detail:
        _detail(pg, "all_reduce_coalesced", bufs[0][2], [t.shape for t in tensors], opc)
    works = [pg._pg.all_reduce(p, n, c, opc, t, premul) for (p, n, c), t in zip(bufs, tensors)]
    return _finish(_core.join(works), tensors, async_op)


@profiled(Spec("reduce", "tensor", "tensor", root="root"))
def reduce(pg: Any, tensor: Any, root: int, op: Any, async_op: bool) -> Optional[Work]:
    """``tensor`` of every rank reduced into ``tensor`` on group rank ``root``."""
    buf = routed(tensor, "tensor", True)
    if buf is None:
        opc, premul = _cuda_reduce_args(op, tensor, "reduce")
        return cuda.reduce(pg, tensor, root, opc, premul, async_op)
    ptr, n, code = buf
    opc, premul = _reduce_args(op, code, "reduce")
    if _debug.detail:
        _detail(pg, "reduce", code, [tensor.shape], opc, root)
    work = pg._pg.reduce(ptr, n, code, opc, root, tensor, premul, sync=not async_op)
    return _finish(work, [tensor], async_op)


@profiled(Spec("broadcast", "tensor", "tensor", root="root"))
def broadcast(pg: Any, tensor: Any, root: int, async_op: bool) -> Optional[Work]:
    """``tensor`` of group rank ``root`` copied into every rank's ``tensor``."""
    buf = routed(tensor, "tensor", True)
    if buf is None:
        return cuda.broadcast(pg, tensor, root, async_op)
    ptr, n, code = buf
    if _debug.detail:
        _detail(pg, "broadcast", code, [tensor.shape], None, root)
    if not async_op:
        pg._pg.broadcast(ptr, n, code, root, None, True)
        return None
    return Work(pg._pg.broadcast(ptr, n, code, root, tensor), [tensor])


@profiled(Spec("reduce_scatter_tensor", "input", "output"))
def reduce_scatter_tensor(pg: Any, output: Any, input: Any, op: Any,  # noqa: A002
                          async_op: bool) -> Optional[Work]:
    """Block r of ``input`` (``world_size`` blocks of ``output``'s size) reduced over the
    group into ``output`` on rank r."""
    buf = routed(output, "output", True)
    if buf is None:
        opc, premul = _cuda_reduce_args(op, output, "reduce_scatter")
        return cuda.reduce_scatter_tensor(pg, output, input, opc, premul, async_op)
    out_ptr, n, code = buf
    in_ptr, m, in_code = buffer(input, "input")
    if in_code != code or m != pg._size * n:
        _check_pair("reduce_scatter_tensor", ("input", input, m, in_code),
                    ("output", output, n, code), pg._size)
    opc, premul = _reduce_args(op, code, "reduce_scatter")
    if _debug.detail:
        _detail(pg, "reduce_scatter_tensor", code, [output.shape], opc)
    if not async_op:
        pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, None, premul, True)
        return None
    work = pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, (input, output), premul)
    return Work(work, [output])


@profiled(Spec("reduce_scatter", "input_list", "output"))
def reduce_scatter(pg: Any, output: Any, input_list: list[Any], op: Any,
                   async_op: bool) -> Optional[Work]:
    """``input_list[r]`` of every rank reduced into ``output`` on rank r."""
    buf = routed(output, "output", True)
    if buf is None:
        opc, premul = _cuda_reduce_args(op, output, "reduce_scatter")
        return cuda.reduce_scatter(pg, output, input_list, opc, premul, async_op)
    out_ptr, n, code = buf
    if len(input_list) != pg._size:
        raise RuntimeError(
            f"reduce_scatter: input_list has {len(input_list)} tensors, expected one per rank "
            f"(world size {pg._size})"
        )
    for i, t in enumerate(input_list):
        _, m, c = buffer(t, "input_list")
        _same_dtype(code, c, t, output)
        if m != n:
            raise RuntimeError(f"reduce_scatter: input_list[{i}] has {m} elements but `output` "
                               f"has {n} (every input must have the output's size)")
    opc, premul = _reduce_args(op, code, "reduce_scatter")
    if _debug.detail:
        _detail(pg, "reduce_scatter", code, [output.shape], opc)
    flat = concat(input_list)  # the engine reduces one contiguous input
    in_ptr = buffer(flat, "input_list")[0]
    work = pg._pg.reduce_scatter(in_ptr, out_ptr, n, code, opc, (flat, output), premul,
                                 sync=not async_op)
    return _finish(work, [output], async_op)


# ---------------------------------------------------------------------------------------------
# Gathers


@profiled(Spec("all_gather", "tensor", "tensor_list"))
def all_gather(pg: Any, tensor_list: list[Any], tensor: Any, async_op: bool) -> Optional[Work]:
    """Every rank's ``tensor`` into ``tensor_list`` (rank r's block r, of rank r's size)."""
    st = unalias([tensor, *tensor_list], [READ] + [WRITE] * len(tensor_list))
    if st is not None:
        return _staged(st, lambda ts: all_gather(pg, ts[1:], ts[0], True), tensor_list,
                       async_op)
    buf = routed(tensor, "tensor")
    if buf is None:
        return cuda.all_gather(pg, tensor_list, tensor, async_op)
    in_ptr, n, code = buf
    if len(tensor_list) != pg._size:
        raise RuntimeError(
            f"all_gather: invalid output tensor list at index 0 (expected length {pg._size}, "
            f"got {len(tensor_list)}): `tensor_list` needs one tensor per rank"
        )
    outs = []
    equal = True
    for t in tensor_list:
        p, m, c = buffer(t, "tensor_list", True)
        _same_dtype(code, c, t, tensor)
        equal = equal and m == n
        outs.append((p, m))
    keep = (tensor, *tensor_list)
    if equal:  # every rank's tensor has this rank's size: the all_gather algorithm
        if _debug.detail:
            _detail(pg, "all_gather", code, [tensor.shape])
        work = pg._pg.all_gather(in_ptr, [p for p, _ in outs], n, code, keep,
                                 sync=not async_op)
    else:
        own = outs[pg._rank][1]
        if own != n:
            raise RuntimeError(
                f"all_gather: invalid tensor size at index {pg._rank}: tensor_list[{pg._rank}] "
                f"has {own} elements but this rank's `tensor` has {n} (tensor_list[r] must "
                "have the size of rank r's tensor)"
            )
        if _debug.detail:
            _detail(pg, "all_gather", code, None)
        sends = [(r, in_ptr, n) for r in range(pg._size)]
        recvs = [(r, p, m) for r, (p, m) in enumerate(outs)]
        work = pg._pg.exchange("all_gather", code, 0, sends, recvs, keep, sync=not async_op)
    return _finish(work, tensor_list, async_op)


def _check_coalesced_outputs(outputs: list[list[Any]], inputs: list[Any]) -> None:
    """all_gather_coalesced: ``outputs[r][i]`` has the dtype and size of ``inputs[i]`` (gloo's
    checks, RuntimeError), so that every rank sees a wrong output, not only its owner."""
    for i, inp in enumerate(inputs):
        for out in outputs:
            if out[i].dtype != inp.dtype:
                raise RuntimeError(
                    f"all_gather_coalesced: invalid tensor type at index {i} (expected "
                    f"{inp.dtype}, got {out[i].dtype})")
            if _numel(out[i]) != _numel(inp):
                raise RuntimeError(
                    f"all_gather_coalesced: invalid size of output tensor at index {i} "
                    f"(expected length {tuple(inp.shape)}, got {tuple(out[i].shape)})")


@profiled(Spec("all_gather_coalesced", "input_tensor_list", "output_tensor_lists"))
def all_gather_coalesced(pg: Any, output_tensor_lists: list[list[Any]],
                         input_tensor_list: list[Any], async_op: bool) -> Optional[Work]:
    """Every rank's ``input_tensor_list[i]`` into ``output_tensor_lists[r][i]``, as one
    call; the lists' lengths are checked (torch's checks before them are the caller's)."""
    if len(output_tensor_lists) != pg._size:
        raise RuntimeError(
            "all_gather_coalesced: output lists should be equal to world size "
            f"({len(output_tensor_lists)} lists, world size {pg._size})"
        )
    n = len(input_tensor_list)
    for out in output_tensor_lists:
        if len(out) != n:
            raise RuntimeError("all_gather_coalesced: each output list should have one tensor "
                               f"per input tensor ({len(out)} vs {n})")
    _check_coalesced_outputs(output_tensor_lists, input_tensor_list)
    outs = [t for out in output_tensor_lists for t in out]
    st = unalias([*input_tensor_list, *outs], [READ] * n + [WRITE] * len(outs))
    if st is not None:
        def run(ts: list[Any]) -> Any:
            lists = [ts[n + r * n:n + (r + 1) * n] for r in range(pg._size)]
            return all_gather_coalesced(pg, lists, ts[:n], True)

        return _staged(st, run, output_tensor_lists, async_op)
    works = [all_gather(pg, [out[i] for out in output_tensor_lists], inp, True)
             for i, inp in enumerate(input_tensor_list)]
    return joined(works, output_tensor_lists, async_op)


@profiled(Spec("all_gather_into_tensor", "input_tensor", "output_tensor"))
def all_gather_into_tensor(pg: Any, output_tensor: Any, input_tensor: Any,
                           async_op: bool) -> Optional[Work]:
    """Every rank's ``input_tensor`` into ``output_tensor``, rank r's block r-th."""
    buf = routed(input_tensor, "input_tensor")
    if buf is None:
        return cuda.all_gather_into_tensor(pg, output_tensor, input_tensor, async_op)
    in_ptr, n, code = buf
    out_ptr, m, out_code = buffer(output_tensor, "output_tensor", True)
    if out_code != code or m != pg._size * n:
        _check_pair("all_gather_into_tensor", ("output_tensor", output_tensor, m, out_code),
                    ("input_tensor", input_tensor, n, code), pg._size)
    if _debug.detail:
        _detail(pg, "all_gather_into_tensor", code, [input_tensor.shape])
    if not async_op:
        pg._pg.all_gather(in_ptr, out_ptr, n, code, None, True)
        return None
    work = pg._pg.all_gather(in_ptr, out_ptr, n, code, (input_tensor, output_tensor))
    return Work(work, [output_tensor])


def _check_pair(op: str, big: tuple[str, Any, int, int], small: tuple[str, Any, int, int],
                size: int) -> None:
    """The larger tensor of all_gather_into_tensor/reduce_scatter_tensor must have the other's
    dtype and ``world_size`` times its elements. Each is ``(name, tensor, numel, code)``."""
    (big_name, big_t, big_n, big_code), (small_name, small_t, small_n, small_code) = big, small
    if big_code != small_code:
        raise RuntimeError(f"{op}: dtype mismatch, `{big_name}` is {big_t.dtype} but "
                           f"`{small_name}` is {small_t.dtype}")
    if big_n != size * small_n:
        raise RuntimeError(
            f"{op}: invalid tensor size: `{big_name}` must have world_size ({size}) * "
            f"{small_n} = {size * small_n} elements, it has {big_n} (shape {tuple(big_t.shape)})"
        )


@profiled(Spec("coalesced", "inputs", "outputs"))
def pairs_coalesced(name: str, pg: Any, outputs: list[Any], inputs: list[Any],
                    op: Any = _SUM) -> Work:
    """``all_gather_into_tensor`` or ``reduce_scatter_tensor`` (``name``) of each
    ``(outputs[i], inputs[i])`` as one asynchronous call (the torch door's ``*_coalesced``
    methods): every input is read as it was when the call was made, even where an earlier
    pair's output overlaps it."""
    n = len(outputs)
    st = unalias([*outputs, *inputs], [WRITE] * n + [READ] * len(inputs))
    if st is not None:
        return _staged(st, lambda ts: pairs_coalesced(name, pg, ts[:n], ts[n:], op), outputs,
                       True)
    if name == "all_gather_into_tensor":
        works = [all_gather_into_tensor(pg, o, i, True) for o, i in zip(outputs, inputs)]
    else:
        works = [reduce_scatter_tensor(pg, o, i, op, True) for o, i in zip(outputs, inputs)]
    return joined(works, outputs, True)


def _rooted(kind: str, pg: Any, root: int, tensor: Any, buf: tuple[int, int, int],
            xs: list[Any], sized: bool, out: bool, sync: bool) -> Any:
    """The exchange of gather (``out=False``: ``tensor``, whose buffer is ``buf``, goes to the
    root, the root's ``xs`` receive) or scatter (``out=True``: the root's ``xs`` go out,
    ``tensor`` receives); None once done when ``sync``. ``sized=False``: blocks of any size
    (the object collectives)."""
    ptr, n, code = buf
    name = "scatter_list" if out else "gather_list"
    peers = []
    for r, t in enumerate(xs):
        p, m, c = buffer(t, name, not out)
        _same_dtype(code, c, t, tensor)
        if sized and m != n:
            raise RuntimeError(f"{kind}: invalid tensor size at index {r} ({name}[{r}] has {m} "
                               f"elements but `tensor` has {n})")
        peers.append((r, p, m))
    mine = [(root, ptr, n)]
    sends, recvs = (peers, mine) if out else (mine, peers)
    if _debug.detail:
        _detail(pg, kind, code, [tensor.shape] if sized else None, None, root)
    return pg._pg.exchange(kind, code, n if sized else 0, sends, recvs, (tensor, *xs), sync=sync)


@profiled(Spec("gather", "tensor", "xs", root="root"))
def gather(pg: Any, tensor: Any, xs: list[Any], root: int, async_op: bool,
           sized: bool = True) -> Optional[Work]:
    """Every rank's ``tensor`` into ``xs`` (one per rank on the root, empty elsewhere) on
    group rank ``root``; ``sized=False`` takes blocks of any size."""
    st = unalias([tensor, *xs], [READ] + [WRITE] * len(xs))
    if st is not None:
        return _staged(st, lambda ts: gather(pg, ts[0], ts[1:], root, True, sized), xs,
                       async_op)
    buf = routed(tensor, "tensor")
    if buf is None:
        return cuda.gather(pg, tensor, xs or None, root, async_op)
    work = _rooted("gather", pg, root, tensor, buf, xs, sized, False, not async_op)
    return _finish(work, [xs] if xs else [], async_op)


@profiled(Spec("scatter", "xs", "tensor", root="root"))
def scatter(pg: Any, tensor: Any, xs: list[Any], root: int, async_op: bool,
            sized: bool = True) -> Optional[Work]:
    """The root's ``xs[r]`` (one per rank on the root, empty elsewhere) into ``tensor`` on
    rank r; ``sized=False`` takes blocks of any size."""
    st = unalias([tensor, *xs], [WRITE] + [READ] * len(xs))
    if st is not None:
        return _staged(st, lambda ts: scatter(pg, ts[0], ts[1:], root, True, sized),
                       [tensor], async_op)
    buf = routed(tensor, "tensor", True)
    if buf is None:
        return cuda.scatter(pg, tensor, xs or None, root, async_op)
    work = _rooted("scatter", pg, root, tensor, buf, xs, sized, True, not async_op)
    return _finish(work, [tensor], async_op)


# ---------------------------------------------------------------------------------------------
# All-to-all


@profiled(Spec("all_to_all", "input_tensor_list", "output_tensor_list"))
def all_to_all(pg: Any, output_tensor_list: list[Any], input_tensor_list: list[Any],
               async_op: bool) -> Optional[Work]:
    """Rank r's ``input_tensor_list[s]`` into rank s's ``output_tensor_list[r]``."""
    for xs, name in ((output_tensor_list, "output_tensor_list"),
                     (input_tensor_list, "input_tensor_list")):
        if len(xs) != pg._size:
            raise RuntimeError(f"all_to_all: {name} has {len(xs)} tensors, expected one per "
                               f"rank (group size {pg._size})")
    size = pg._size
    st = unalias([*input_tensor_list, *output_tensor_list], [READ] * size + [WRITE] * size)
    if st is not None:
        return _staged(st, lambda ts: all_to_all(pg, ts[size:], ts[:size], True),
                       output_tensor_list, async_op)
    first = input_tensor_list[0] if input_tensor_list else None
    if first is not None and getattr(first, "is_cuda", False):
        return cuda.all_to_all(pg, output_tensor_list, input_tensor_list, async_op)
    code = -1
    sends, recvs = [], []
    for r, t in enumerate(input_tensor_list):
        p, n, c = buffer(t, "input_tensor_list")
        code = c if code < 0 else code
        _same_dtype(code, c, t, first)
        sends.append((r, p, n))
    for r, t in enumerate(output_tensor_list):
        p, n, c = buffer(t, "output_tensor_list", True)
        _same_dtype(code, c, t, first)
        recvs.append((r, p, n))
    if _debug.detail:
        _detail(pg, "all_to_all", code, None)
    work = pg._pg.exchange("all_to_all", code, 0, sends, recvs,
                           (*input_tensor_list, *output_tensor_list), sync=not async_op)
    return _finish(work, output_tensor_list, async_op)


def _splits(x: Any, n: int, sizes: Optional[list[int]], name: str, size: int) -> list[int]:
    """Element offsets (``size + 1`` of them) of the blocks of ``x`` (``n`` elements) split
    along dim 0: by ``sizes``, or in ``size`` equal blocks when it is None or empty."""
    rows = dim0(x)
    if not sizes:
        if rows % size:
            raise RuntimeError(f"all_to_all_single: `{name}`'s dimension 0 ({rows}) must be "
                               f"divisible by the group size {size}")
        block = n // size
        return [r * block for r in range(size + 1)]
    if len(sizes) != size:
        raise RuntimeError(f"all_to_all_single: {name}_split_sizes has {len(sizes)} entries, "
                           f"expected one per rank (group size {size})")
    if sum(sizes) != rows or any(s < 0 for s in sizes):
        raise RuntimeError(f"all_to_all_single: {name}_split_sizes {list(sizes)} must be "
                           f"non-negative and sum to `{name}`'s dimension 0 ({rows})")
    per_row = n // rows if rows else 0
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + s * per_row)
    return offsets


@profiled(Spec("all_to_all_single", "input", "output", "input_split_sizes",
              "output_split_sizes"))
def all_to_all_single(pg: Any, output: Any, input: Any,  # noqa: A002
                      output_split_sizes: Optional[list[int]],
                      input_split_sizes: Optional[list[int]],
                      async_op: bool) -> Optional[Work]:
    """``input`` split along dim 0 (equal blocks where the sizes are None or empty), block r
    to rank r; what every rank sends, in rank order, into ``output``."""
    buf = routed(output, "output", True)
    if buf is None:
        return cuda.all_to_all_single(pg, output, input, output_split_sizes or None,
                                      input_split_sizes or None, async_op)
    out_ptr, n_out, code = buf
    in_ptr, n_in, in_code = buffer(input, "input")
    _same_dtype(in_code, code, output, input)
    size = pg._size
    offs_in = _splits(input, n_in, input_split_sizes, "input", size)
    offs_out = _splits(output, n_out, output_split_sizes, "output", size)
    equal = not output_split_sizes and not input_split_sizes
    if _debug.detail:
        _detail(pg, "all_to_all_single", code, [input.shape] if equal else None)
    if equal and offs_in[1] == offs_out[1]:  # blocks of one size: the engine lays them out
        count, sends, recvs = offs_in[1], in_ptr, out_ptr
    else:
        item = ITEMSIZE[code]
        count = 0
        sends = [(r, in_ptr + offs_in[r] * item, offs_in[r + 1] - offs_in[r])
                 for r in range(size)]
        recvs = [(r, out_ptr + offs_out[r] * item, offs_out[r + 1] - offs_out[r])
                 for r in range(size)]
    if not async_op:
        pg._pg.exchange("all_to_all", code, count, sends, recvs, None, True)
        return None
    return Work(pg._pg.exchange("all_to_all", code, count, sends, recvs, (input, output)),
                [output])


# ---------------------------------------------------------------------------------------------
# Barriers


@profiled(Spec("barrier", None, None))
def barrier(pg: Any, async_op: bool, timeout: Optional[timedelta]) -> Optional[Work]:
    """Every rank of the group has reached it (``timeout``: of this barrier, else the
    group's)."""
    if _debug.detail:
        _detail(pg, "barrier", None, None)
    if timeout is None and not async_op:
        pg._pg.barrier(True)
        return None
    work = pg._pg.barrier()
    if async_op:
        return Work(work, [], timeout)
    work.wait(None if timeout is None else seconds(timeout))
    return None


@profiled(Spec("monitored_barrier", None, None))
def monitored_barrier(pg: Any, timeout: timedelta, wait_all_ranks: bool) -> None:
    """A barrier whose rank 0 names the ranks that did not reach it within ``timeout``."""
    pg._pg.monitored_barrier(timeout.total_seconds(), wait_all_ranks).wait()


# ---------------------------------------------------------------------------------------------
# Point-to-point


@profiled(Spec("isend", "tensor", None, root="peer"))
def isend(pg: Any, tensor: Any, peer: int, tag: int) -> Work:
    """``tensor`` sent to group rank ``peer``."""
    buf = routed(tensor, "tensor")
    if buf is None:
        return cuda.isend(pg, tensor, peer, tag)
    ptr, n, code = buf
    return Work(pg._pg.send(ptr, n, code, peer, tag, tensor), [tensor])


@profiled(Spec("irecv", None, "tensor", root="peer"))
def irecv(pg: Any, tensor: Any, peer: Optional[int], tag: int) -> Work:
    """A receive into ``tensor`` from group rank ``peer`` (None: from any rank)."""
    buf = routed(tensor, "tensor", True)
    if buf is None:
        return cuda.irecv(pg, tensor, peer, tag)
    ptr, n, code = buf
    return Work(pg._pg.recv(ptr, n, code, peer, tag, tensor), [tensor])


def sender(work: Work) -> int:
    """The group rank that sent what the completed receive ``work`` got."""
    if isinstance(work, cuda.CudaWork):
        work._synchronize_host()  # the sender is known once the data has arrived
    return work.source_rank()


@profiled(Spec("batch_isend_irecv", None, None))
def batch_isend_irecv(pg: Any, ops: list[tuple[bool, Any, int, int]]) -> list[Work]:
    """``ops`` — ``(is_send, tensor, group peer rank, tag)`` each — posted in order without
    waiting; one Work per operation (CUDA: one for the whole batch, NCCL's group call)."""
    st = unalias([t for _, t, _, _ in ops], [READ if s else WRITE for s, _, _, _ in ops])
    if st is not None:
        def run(ts: list[Any]) -> list[Work]:
            return batch_isend_irecv(pg, [(s, t, peer, tag)
                                          for (s, _, peer, tag), t in zip(ops, ts)])

        # Every request stands for the whole batch: the copies back need all of it done.
        done = _staged(st, run, [t for _, t, _, _ in ops], True)
        return [done] * len(ops)  # type: ignore[list-item]
    if ops and getattr(ops[0][1], "is_cuda", False):
        # One NCCL group call for them all (ncclGroupStart/End), as torch's NCCL does.
        return cuda.batch_isend_irecv(pg, ops)
    return [isend(pg, t, peer, tag) if is_send else irecv(pg, t, peer, tag)
            for is_send, t, peer, tag in ops]
