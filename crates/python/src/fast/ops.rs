//! The fast functions (all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
//! all_to_all_single, barrier): which calls take the fast path, running them on the engine,
//! and handing every other call to the Python function.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::args::{async_op, bind, given, Args, Bound6};
use super::read::{checks_off, cpu_tensor, is_sum, rows_divide, rustdist_group};
use super::state::{State, STATE};
use crate::dlpack::DenseBuffer;
use crate::group::{ExchangeBlocks, GatherOutputs, PyProcessGroup};
use crate::work::PyWork;

#[derive(Clone, Copy)]
pub(super) enum Op {
    AllReduce,
    Broadcast,
    AllGatherIntoTensor,
    ReduceScatterTensor,
    AllToAllSingle,
    Barrier,
}

/// Every op, indexed by its discriminant.
pub(super) const OPS: [Op; 6] = [
    Op::AllReduce,
    Op::Broadcast,
    Op::AllGatherIntoTensor,
    Op::ReduceScatterTensor,
    Op::AllToAllSingle,
    Op::Barrier,
];

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::Broadcast => "broadcast",
            Op::AllGatherIntoTensor => "all_gather_into_tensor",
            Op::ReduceScatterTensor => "reduce_scatter_tensor",
            Op::AllToAllSingle => "all_to_all_single",
            Op::Barrier => "barrier",
        }
    }

    /// The Python function's parameters, in order.
    fn params(self) -> &'static [&'static str] {
        match self {
            Op::AllReduce => &["tensor", "op", "group", "async_op"],
            Op::Broadcast => &["tensor", "src", "group", "async_op", "group_src"],
            Op::AllGatherIntoTensor => &["output_tensor", "input_tensor", "group", "async_op"],
            Op::ReduceScatterTensor => &["output", "input", "op", "group", "async_op"],
            Op::AllToAllSingle => &[
                "output",
                "input",
                "output_split_sizes",
                "input_split_sizes",
                "group",
                "async_op",
            ],
            Op::Barrier => &["group", "async_op", "device_ids", "timeout"],
        }
    }
}

/// The Python function each op stands in for (set by [`fast_function`]).
pub(super) static PYTHON: [PyOnceLock<Py<PyAny>>; OPS.len()] =
    [const { PyOnceLock::new() }; OPS.len()];

/// all_gather_into_tensor (`gather`) or reduce_scatter_tensor on `core` of plain CPU tensors
/// whose sizes agree; None hands the call to Python.
pub(super) fn gathered<'py>(
    st: &State,
    core: Bound<'py, PyProcessGroup>,
    gather: bool,
    out: &Bound<'py, PyAny>,
    inp: &Bound<'py, PyAny>,
) -> PyResult<Option<Ready<'py>>> {
    let (Some(o), Some(i)) = (cpu_tensor(st, out)?, cpu_tensor(st, inp)?) else {
        return Ok(None);
    };
    let (big, small) = if gather { (o, i) } else { (i, o) };
    if big.code != small.code || big.numel != core.get().size() * small.numel {
        return Ok(None);
    }
    let pair = (out.clone(), inp.clone());
    Ok(Some(if gather {
        Ready::AllGather(core, small, big.ptr, pair)
    } else {
        Ready::ReduceScatter(core, big.ptr, small, pair)
    }))
}

/// A call's (output, input) tensors.
pub(super) type Pair<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

/// A call that takes the fast path, with what the engine needs and the tensors it was given
/// (an asynchronous call keeps them alive until it completes).
pub(super) enum Ready<'py> {
    /// (group, buffer, tensor)
    AllReduce(Bound<'py, PyProcessGroup>, DenseBuffer, Bound<'py, PyAny>),
    /// (group, buffer, root, tensor)
    Broadcast(
        Bound<'py, PyProcessGroup>,
        DenseBuffer,
        usize,
        Bound<'py, PyAny>,
    ),
    AllGather(Bound<'py, PyProcessGroup>, DenseBuffer, usize, Pair<'py>),
    ReduceScatter(Bound<'py, PyProcessGroup>, usize, DenseBuffer, Pair<'py>),
    /// (group, output, input, tensors): blocks of equal size.
    AllToAll(
        Bound<'py, PyProcessGroup>,
        DenseBuffer,
        DenseBuffer,
        Pair<'py>,
    ),
    Barrier(Bound<'py, PyProcessGroup>),
}

impl<'py> Ready<'py> {
    /// What the engine keeps alive while the call runs asynchronously (the tensor, or the
    /// (input, output) pair, as the Python functions pass it), and the Work's outputs.
    fn held(&self, py: Python<'py>) -> PyResult<(Py<PyAny>, Bound<'py, PyList>)> {
        Ok(match self {
            Ready::AllReduce(.., t) | Ready::Broadcast(.., t) => {
                (t.clone().unbind(), PyList::new(py, [t])?)
            }
            Ready::AllGather(.., (out, inp))
            | Ready::ReduceScatter(.., (out, inp))
            | Ready::AllToAll(.., (out, inp)) => (
                PyTuple::new(py, [inp, out])?.into_any().unbind(),
                PyList::new(py, [out])?,
            ),
            Ready::Barrier(_) => (py.None(), PyList::empty(py)),
        })
    }
}

/// The call of `op` with arguments `a`, when it is the usual kind, and whether it is
/// asynchronous; None hands it to Python (also when a check fails with an error: Python
/// raises the error torch.distributed would).
fn ready<'py>(op: Op, py: Python<'py>, a: &Bound6<'py>) -> PyResult<Option<(Ready<'py>, bool)>> {
    let Some(st) = STATE.get(py) else {
        return Ok(None);
    };
    let Some(asynchronous) = op
        .params()
        .iter()
        .position(|&p| p == "async_op")
        .and_then(|i| async_op(&a[i]))
    else {
        return Ok(None);
    };
    if !checks_off(st, py)? {
        return Ok(None);
    }
    let call = match op {
        Op::AllReduce => {
            let (Some(t), true) = (given(&a[0]), is_sum(st, &a[1])?) else {
                return Ok(None);
            };
            match (rustdist_group(st, py, &a[2])?, cpu_tensor(st, t)?) {
                (Some((_, core)), Some(buf)) => Some(Ready::AllReduce(core, buf, t.clone())),
                _ => None,
            }
        }
        Op::Broadcast => {
            let Some(t) = given(&a[0]) else {
                return Ok(None);
            };
            let (Some((pg, core)), Some(buf)) =
                (rustdist_group(st, py, &a[2])?, cpu_tensor(st, t)?)
            else {
                return Ok(None);
            };
            let root = match (given(&a[1]), given(&a[4])) {
                (None, Some(group_src)) => group_src.extract::<usize>()?,
                (Some(src), None) => {
                    let ranks = pg.getattr(intern!(py, "_group_ranks"))?;
                    if ranks.is_none() {
                        src.extract::<usize>()?
                    } else {
                        match ranks.cast::<PyDict>()?.get_item(src)? {
                            Some(r) => r.extract()?,
                            None => return Ok(None),
                        }
                    }
                }
                _ => return Ok(None),
            };
            (root < core.get().size()).then(|| Ready::Broadcast(core, buf, root, t.clone()))
        }
        Op::AllGatherIntoTensor | Op::ReduceScatterTensor => {
            let gather = matches!(op, Op::AllGatherIntoTensor);
            let (op_ok, group) = if gather {
                (true, &a[2])
            } else {
                (is_sum(st, &a[2])?, &a[3])
            };
            let (Some(out), Some(inp), true) = (given(&a[0]), given(&a[1]), op_ok) else {
                return Ok(None);
            };
            match rustdist_group(st, py, group)? {
                Some((_, core)) => gathered(st, core, gather, out, inp)?,
                None => None,
            }
        }
        Op::AllToAllSingle => {
            let (Some(out), Some(inp), None, None) =
                (given(&a[0]), given(&a[1]), given(&a[2]), given(&a[3]))
            else {
                return Ok(None);
            };
            let (Some((_, core)), Some(o), Some(i)) = (
                rustdist_group(st, py, &a[4])?,
                cpu_tensor(st, out)?,
                cpu_tensor(st, inp)?,
            ) else {
                return Ok(None);
            };
            let size = core.get().size();
            let equal = o.numel == i.numel && o.code == i.code;
            (equal && rows_divide(out, &o, size)? && rows_divide(inp, &i, size)?)
                .then(|| Ready::AllToAll(core, o, i, (out.clone(), inp.clone())))
        }
        Op::Barrier => {
            if given(&a[2]).is_some() || given(&a[3]).is_some() {
                return Ok(None);
            }
            rustdist_group(st, py, &a[0])?.map(|(_, core)| Ready::Barrier(core))
        }
    };
    Ok(call.map(|c| (c, asynchronous)))
}

/// Runs a call that took the fast path on the engine: synchronously without `keep`, else
/// asynchronously, keeping `keep` alive until it completes, and returning its Work.
fn run(py: Python<'_>, call: Ready<'_>, keep: Option<Py<PyAny>>) -> PyResult<Option<PyWork>> {
    let sync = keep.is_none();
    let keep = || keep.unwrap_or_else(|| py.None());
    Ok(match call {
        Ready::AllReduce(core, t, _) => {
            core.get()
                .all_reduce(py, t.ptr, t.numel, t.code, 0, keep(), None, sync)?
        }
        Ready::Broadcast(core, t, root, _) => {
            core.get()
                .broadcast(py, t.ptr, t.numel, t.code, root, keep(), sync)?
        }
        Ready::AllGather(core, input, out, _) => {
            let outputs = GatherOutputs::Contiguous(out);
            core.get().all_gather(
                py,
                input.ptr,
                outputs,
                input.numel,
                input.code,
                keep(),
                sync,
            )?
        }
        Ready::ReduceScatter(core, input, out, _) => core.get().reduce_scatter(
            py,
            input,
            out.ptr,
            out.numel,
            out.code,
            0,
            keep(),
            None,
            sync,
        )?,
        Ready::AllToAll(core, out, inp, _) => {
            let count = (out.numel / core.get().size()) as u64;
            let sends = ExchangeBlocks::Uniform(inp.ptr);
            let recvs = ExchangeBlocks::Uniform(out.ptr);
            core.get().exchange(
                py,
                "all_to_all",
                out.code,
                count,
                sends,
                recvs,
                keep(),
                sync,
            )?
        }
        Ready::Barrier(core) => core.get().barrier(py, sync)?,
    })
}

/// Who called the fast path: the Work of an asynchronous call is made for them.
#[derive(Clone, Copy)]
pub(super) enum Door {
    /// `import rustdist as dist`: rustdist's Work.
    ImportSwap,
    /// torch.distributed calling the group's methods: a Work handed to torch.
    Torch,
}

/// The call of `op` with `args`, on the fast path or through its Python function.
pub(super) fn call(op: Op, args: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let bound = bind(op.params(), args);
    let Some(Ok(Some((ready, asynchronous)))) = bound.as_ref().map(|a| ready(op, py, a)) else {
        return fallback(&PYTHON[op as usize], op.name(), args);
    };
    run_logged(py, op, ready, asynchronous.then_some(Door::ImportSwap))
}

/// Runs `ready` (a call of `op`): synchronously, returning None, or asynchronously (`door`
/// says for whom), returning its Work; an error is logged as the Python function's
/// exception_logger would have.
pub(super) fn run_logged(
    py: Python<'_>,
    op: Op,
    ready: Ready<'_>,
    door: Option<Door>,
) -> PyResult<Py<PyAny>> {
    let ran = match door {
        None => run(py, ready, None).map(|_| py.None()),
        Some(door) => ready.held(py).and_then(|(keep, outputs)| {
            let work = run(py, ready, Some(keep))?
                .ok_or_else(|| PyValueError::new_err("an asynchronous call made no Work"))?;
            let st = STATE
                .get(py)
                .ok_or_else(|| PyValueError::new_err("the fast path is not set up"))?;
            let make = match door {
                Door::ImportSwap => &st.work,
                Door::Torch => &st.handed_work,
            };
            make.call1(py, (work, outputs))
        }),
    };
    match ran {
        Ok(value) => Ok(value),
        Err(e) => {
            if let Some(st) = STATE.get(py) {
                st.log.call1(py, (op.name(), e.value(py)))?;
            }
            Err(e)
        }
    }
}

/// The call handed to `python` (the function behind fast path `name`), as a tuple and a dict.
pub(super) fn fallback(
    python: &PyOnceLock<Py<PyAny>>,
    name: &str,
    args: &Args<'_, '_>,
) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let python = python
        .get(py)
        .ok_or_else(|| PyValueError::new_err(format!("the fast path of {name} is not set up")))?;
    let positional = args.positional();
    let tuple = PyTuple::new(py, args.iter().take(positional))?;
    let kwargs = match &args.kwnames {
        Some(names) => {
            let dict = PyDict::new(py);
            for (name, value) in names.iter().zip(args.iter().skip(positional)) {
                dict.set_item(name, value)?;
            }
            Some(dict)
        }
        None => None,
    };
    python.call(py, tuple, kwargs.as_ref())
}
