//! The fast functions (all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
//! all_to_all_single, barrier): which calls take the fast path, running them on the engine,
//! and handing every other call to the Python function.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use super::args::{bind, given, synchronous, Args, Bound6};
use super::read::{checks_off, cpu_tensor, is_sum, rows_divide, rustdist_group};
use super::state::{State, STATE};
use crate::dlpack::DenseBuffer;
use crate::group::{ExchangeBlocks, GatherOutputs, PyProcessGroup};

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
    Ok(Some(if gather {
        Ready::AllGather(core, small, big.ptr)
    } else {
        Ready::ReduceScatter(core, big.ptr, small)
    }))
}

/// A call that takes the fast path, with what the engine needs.
pub(super) enum Ready<'py> {
    AllReduce(Bound<'py, PyProcessGroup>, DenseBuffer),
    Broadcast(Bound<'py, PyProcessGroup>, DenseBuffer, usize),
    AllGather(Bound<'py, PyProcessGroup>, DenseBuffer, usize),
    ReduceScatter(Bound<'py, PyProcessGroup>, usize, DenseBuffer),
    /// (group, output, input): blocks of equal size.
    AllToAll(Bound<'py, PyProcessGroup>, DenseBuffer, DenseBuffer),
    Barrier(Bound<'py, PyProcessGroup>),
}

/// The call of `op` with arguments `a`, when it is the usual kind; None hands it to Python
/// (also when a check fails with an error: Python raises the error torch.distributed would).
fn ready<'py>(op: Op, py: Python<'py>, a: &Bound6<'py>) -> PyResult<Option<Ready<'py>>> {
    let Some(st) = STATE.get(py) else {
        return Ok(None);
    };
    if !checks_off(st, py)? {
        return Ok(None);
    }
    Ok(match op {
        Op::AllReduce => {
            let (Some(t), true, true) = (given(&a[0]), is_sum(st, &a[1])?, synchronous(&a[3]))
            else {
                return Ok(None);
            };
            match (rustdist_group(st, py, &a[2])?, cpu_tensor(st, t)?) {
                (Some((_, core)), Some(buf)) => Some(Ready::AllReduce(core, buf)),
                _ => None,
            }
        }
        Op::Broadcast => {
            let (Some(t), true) = (given(&a[0]), synchronous(&a[3])) else {
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
            (root < core.get().size()).then_some(Ready::Broadcast(core, buf, root))
        }
        Op::AllGatherIntoTensor | Op::ReduceScatterTensor => {
            let gather = matches!(op, Op::AllGatherIntoTensor);
            let (op_ok, group, sync) = if gather {
                (true, &a[2], synchronous(&a[3]))
            } else {
                (is_sum(st, &a[2])?, &a[3], synchronous(&a[4]))
            };
            let (Some(out), Some(inp), true, true) = (given(&a[0]), given(&a[1]), op_ok, sync)
            else {
                return Ok(None);
            };
            match rustdist_group(st, py, group)? {
                Some((_, core)) => gathered(st, core, gather, out, inp)?,
                None => None,
            }
        }
        Op::AllToAllSingle => {
            let (Some(out), Some(inp), None, None, true) = (
                given(&a[0]),
                given(&a[1]),
                given(&a[2]),
                given(&a[3]),
                synchronous(&a[5]),
            ) else {
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
                .then_some(Ready::AllToAll(core, o, i))
        }
        Op::Barrier => {
            if !synchronous(&a[1]) || given(&a[2]).is_some() || given(&a[3]).is_some() {
                return Ok(None);
            }
            rustdist_group(st, py, &a[0])?.map(|(_, core)| Ready::Barrier(core))
        }
    })
}

/// Runs a call that took the fast path, synchronously, on the engine.
fn run(py: Python<'_>, call: Ready<'_>) -> PyResult<()> {
    let none = || py.None();
    match call {
        Ready::AllReduce(core, t) => {
            core.get()
                .all_reduce(py, t.ptr, t.numel, t.code, 0, none(), None, true)?;
        }
        Ready::Broadcast(core, t, root) => {
            core.get()
                .broadcast(py, t.ptr, t.numel, t.code, root, none(), true)?;
        }
        Ready::AllGather(core, input, out) => {
            let outputs = GatherOutputs::Contiguous(out);
            core.get().all_gather(
                py,
                input.ptr,
                outputs,
                input.numel,
                input.code,
                none(),
                true,
            )?;
        }
        Ready::ReduceScatter(core, input, out) => {
            core.get().reduce_scatter(
                py,
                input,
                out.ptr,
                out.numel,
                out.code,
                0,
                none(),
                None,
                true,
            )?;
        }
        Ready::AllToAll(core, out, inp) => {
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
                none(),
                true,
            )?;
        }
        Ready::Barrier(core) => {
            core.get().barrier(py, true)?;
        }
    }
    Ok(())
}

/// The call of `op` with `args`, on the fast path or through its Python function.
pub(super) fn call(op: Op, args: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let bound = bind(op.params(), args);
    let Some(Ok(Some(ready))) = bound.as_ref().map(|a| ready(op, py, a)) else {
        return fallback(&PYTHON[op as usize], op.name(), args);
    };
    run_logged(py, op, ready)
}

/// Runs `ready` (a call of `op`); None, or its error logged as the Python function's
/// exception_logger would have.
pub(super) fn run_logged(py: Python<'_>, op: Op, ready: Ready<'_>) -> PyResult<Py<PyAny>> {
    match run(py, ready) {
        Ok(()) => Ok(py.None()),
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
