"""Sparse COO tensors: ``all_reduce`` with ``ReduceOp.SUM``, as torch.distributed's gloo
backend runs it, and the error every other collective raises for them.

torch.distributed's gloo backend reduces sparse COO CPU tensors in ``all_reduce``
(``ReduceOp.SUM`` only; DDP's reducer relies on it for the gradients of ``nn.Embedding(...,
sparse=True)``), and torch refuses them in every other collective. gloo's algorithm
(``AsyncSparseAllreduceWork`` in torch's ``ProcessGroupGloo.cpp``): coalesce the input,
all-gather every rank's metadata (sizes, nnz), all-gather the indices and the values of every
rank (different nnz per rank), add the ranks' tensors in rank order, coalesce the sum and copy
it into the input tensor, which stays the same tensor object (the Work's result and future
hold it; DDP's reducer reads the future's value and copies it into the gradient). The local
steps here are the same torch operations in the same order, so results are bitwise gloo's.

The transport is rustdist's dense collectives: one fixed-size ``all_gather_into_tensor`` of a
header per rank, then one ``all_gather`` of a byte payload per rank (sizes, indices, values),
whose sizes the headers give. Every rank receives every rank's metadata, so a mismatch (shape,
sparse/dense split, dtype) is seen, and raised, on every rank alike.

The exchange runs at the call, also for ``async_op=True`` (the Work returned has completed,
its result and future hold the tensor): the second exchange's sizes come from the first, and
issuing it later, from a completion callback, could order it differently on different ranks
against the collectives the caller issues meanwhile.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ._reduce_op import op_args
from ._tensor import _TORCH_CODES, ITEMSIZE, torch_code

try:  # torch is optional: without it there are no sparse tensors.
    import torch
except ImportError:
    torch = None  # type: ignore[assignment]

#: gloo's text (``ProcessGroupGloo::allreduce``) for any op but SUM on a sparse tensor.
UNSUPPORTED_OP = ("all_reduce: unsupported reduction operation (allreduce of sparse tensors "
                  "only works with ReduceOp.SUM)")
#: gloo's text when the ranks' sparse tensors differ in shape.
MISMATCH = "Sparse dimensions do not match"
#: torch's text for an in-place collective on a leaf that requires grad (its dispatcher raises
#: it before gloo sees the tensor).
LEAF = "a leaf Variable that requires grad is being used in an in-place operation."

_HEADER = 5  # int64 per rank: sparse_dim, dense_dim, nnz, dtype code, payload bytes
_ALIGN = 16  # the values start at a multiple of this in a payload (complex128's size)


def _is_sum(op: Any) -> bool:
    """Whether ``op`` is ``ReduceOp.SUM`` (rustdist's or torch's, as a value or an instance)."""
    return op_args(op) == (0, None)


def _payload(sizes: list[int], indices: Any, values: Any) -> Any:
    """This rank's bytes: its sizes and indices (int64), padding to a multiple of ``_ALIGN``,
    its values."""
    head = torch.cat([torch.tensor(sizes, dtype=torch.int64), indices.reshape(-1)])
    pad = -head.numel() * 8 % _ALIGN
    return torch.cat([head.view(torch.uint8), torch.zeros(pad, dtype=torch.uint8),
                      values.reshape(-1).view(torch.uint8)])


def all_reduce(tensor: Any, op: Any, world: int, all_gather_into_tensor: Callable[..., Any],
               all_gather: Callable[..., Any]) -> None:
    """Sums sparse COO tensor ``tensor`` over a group of ``world`` ranks in place, moving the
    bytes with that group's ``all_gather_into_tensor(output, input)`` and
    ``all_gather(outputs, input)``.

    As torch.distributed documents for gloo (and as gloo runs it): only ``ReduceOp.SUM``;
    every rank may hold a different number of non-zeros (zero included), coalesced or not;
    afterwards ``tensor`` (the same object) holds the coalesced sum, identical on every rank.
    Raises what gloo raises: RuntimeError for another op (before any communication) and for
    ranks whose tensors differ in shape; NotImplementedError from torch's sparse addition for
    dtypes it cannot add (float16, bool) when there are several ranks. Runs to completion
    before returning (``all_reduce`` hands an ``async_op`` caller a completed Work).
    """
    if tensor.requires_grad and tensor.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(LEAF)
    if not _is_sum(op):
        raise RuntimeError(UNSUPPORTED_OP)
    with torch.no_grad():
        local = tensor.coalesce()
        code = torch_code(local, "tensor")
        sizes = list(local.shape)
        sparse_dim, dense_dim, nnz = local.sparse_dim(), local.dense_dim(), local._nnz()
        payload = _payload(sizes, local._indices(), local._values().contiguous())
        header = torch.tensor([sparse_dim, dense_dim, nnz, code, payload.numel()],
                              dtype=torch.int64)
        headers = torch.empty(world * _HEADER, dtype=torch.int64)
        all_gather_into_tensor(headers, header)
        metas = headers.view(world, _HEADER).tolist()
        chunks = [torch.empty(m[4], dtype=torch.uint8) for m in metas]
        all_gather(chunks, payload)

        ndim = sparse_dim + dense_dim
        value_shape = sizes[sparse_dim:]
        parts: list[tuple[Any, Any]] = []  # (indices, values) of each rank, in rank order
        for (sd, dd, n, c, _), chunk in zip(metas, chunks):
            if c != code:
                names = {v: k for k, v in _TORCH_CODES.items()}
                raise RuntimeError(f"all_reduce: the ranks' sparse tensors differ in dtype "
                                   f"({local.dtype} here, {names.get(c, c)} on another rank)")
            if (sd, dd) != (sparse_dim, dense_dim) or chunk[:ndim * 8].view(
                    torch.int64).tolist() != sizes:
                raise RuntimeError(MISMATCH)
            end = (ndim + sd * n) * 8
            start = end + -end % _ALIGN
            indices = chunk[ndim * 8:end].view(torch.int64).reshape(sd, n)
            values = chunk[start:start + n * math.prod(value_shape) * ITEMSIZE[code]]
            parts.append((indices, values.view(local.dtype).reshape([n] + value_shape)))
        output = torch.sparse_coo_tensor(*parts[0], sizes, check_invariants=False)
        for indices, values in parts[1:]:
            output += torch.sparse_coo_tensor(indices, values, sizes, check_invariants=False)
        tensor.copy_(output.coalesce())


__all__ = ["LEAF", "MISMATCH", "UNSUPPORTED_OP", "all_reduce"]
