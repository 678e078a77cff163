//! The fast methods of rustdist's torch ProcessGroup (allreduce, broadcast, _allgather_base,
//! _reduce_scatter_base, barrier): which calls with torch's option objects take the fast
//! path, synchronous or not; the rest go to the Python method.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyList};

use super::args::{bind, given, Args, Bound6};
use super::ops::{fallback, gathered, run_logged, Door, Op, Ready};
use super::read::{checks_off, cpu_tensor, engine_group, is_sum};
use super::state::{State, STATE};

/// A method that torch's Python API and C++ callers call on a rustdist group (the torch front
/// door) with torch's option objects. Its usual synchronous call (`opts.asyncOp` False) runs
/// here and returns None, which torch reads as "the backend has synchronised": no Work is
/// made and none is waited for. An asynchronous one (C++ callers' default) returns the Work
/// the Python method would.
#[derive(Clone, Copy)]
pub(super) enum Method {
    AllReduce,
    Broadcast,
    AllGatherBase,
    ReduceScatterBase,
    Barrier,
}

/// Every method, indexed by its discriminant.
pub(super) const METHODS: [Method; 5] = [
    Method::AllReduce,
    Method::Broadcast,
    Method::AllGatherBase,
    Method::ReduceScatterBase,
    Method::Barrier,
];

impl Method {
    pub(super) fn name(self) -> &'static str {
        match self {
            Method::AllReduce => "allreduce",
            Method::Broadcast => "broadcast",
            Method::AllGatherBase => "_allgather_base",
            Method::ReduceScatterBase => "_reduce_scatter_base",
            Method::Barrier => "barrier",
        }
    }

    /// The collective it runs (its name is what a failure is logged as).
    fn op(self) -> Op {
        match self {
            Method::AllReduce => Op::AllReduce,
            Method::Broadcast => Op::Broadcast,
            Method::AllGatherBase => Op::AllGatherIntoTensor,
            Method::ReduceScatterBase => Op::ReduceScatterTensor,
            Method::Barrier => Op::Barrier,
        }
    }

    /// The Python method's parameters after `self`, in order; the options come last.
    fn params(self) -> &'static [&'static str] {
        match self {
            Method::AllReduce | Method::Broadcast => &["tensors", "opts"],
            Method::AllGatherBase | Method::ReduceScatterBase => &["output", "input", "opts"],
            Method::Barrier => &["opts"],
        }
    }
}

/// The Python method each method stands in for (set by [`fast_function`]).
pub(super) static PYTHON_METHODS: [PyOnceLock<Py<PyAny>>; METHODS.len()] =
    [const { PyOnceLock::new() }; METHODS.len()];

/// The tensor of `tensors`, a list of one tensor or a tensor.
fn one_tensor<'py>(st: &State, tensors: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if tensors.get_type().is(st.tensor.bind(tensors.py())) {
        return Ok(Some(tensors.clone()));
    }
    match tensors.cast::<PyList>() {
        Ok(list) if list.len() == 1 => Ok(Some(list.get_item(0)?)),
        _ => Ok(None),
    }
}

/// The call of method `m` on `group` with arguments `a`, when it is the usual kind, and
/// whether it is asynchronous; None hands it to Python.
fn ready_method<'py>(
    m: Method,
    st: &State,
    group: &Bound<'py, PyAny>,
    a: &Bound6<'py>,
) -> PyResult<Option<(Ready<'py>, bool)>> {
    let py = group.py();
    let Some(opts) = given(&a[m.params().len() - 1]) else {
        return Ok(None);
    };
    // A bare ReduceOp in place of the options (Python callers) has no asyncOp.
    let Ok(async_op) = opts.getattr(intern!(py, "asyncOp")) else {
        return Ok(None);
    };
    let asynchronous = !async_op.is(PyBool::new(py, false).as_any());
    if !checks_off(st, py)? {
        return Ok(None);
    }
    let Some(core) = engine_group(st, group)? else {
        return Ok(None);
    };
    let sum = |opts: &Bound<'py, PyAny>| is_sum(st, &Some(opts.getattr(intern!(py, "reduceOp"))?));
    let call = match m {
        Method::AllReduce | Method::Broadcast => {
            let Some(t) = given(&a[0])
                .map(|t| one_tensor(st, t))
                .transpose()?
                .flatten()
            else {
                return Ok(None);
            };
            let Some(buf) = cpu_tensor(st, &t)? else {
                return Ok(None);
            };
            if matches!(m, Method::AllReduce) {
                sum(opts)?.then_some(Ready::AllReduce(core, buf, t))
            } else {
                let root: usize = opts.getattr(intern!(py, "rootRank"))?.extract()?;
                let tensor: usize = opts.getattr(intern!(py, "rootTensor"))?.extract()?;
                (tensor == 0 && root < core.get().size())
                    .then_some(Ready::Broadcast(core, buf, root, t))
            }
        }
        Method::AllGatherBase | Method::ReduceScatterBase => {
            let gather = matches!(m, Method::AllGatherBase);
            let (Some(out), Some(inp)) = (given(&a[0]), given(&a[1])) else {
                return Ok(None);
            };
            if !gather && !sum(opts)? {
                return Ok(None);
            }
            gathered(st, core, gather, out, inp)?
        }
        Method::Barrier => {
            // torch's barrier(timeout=...) sets a timeout of the call (unset: negative, -1 ms);
            // the Python method applies it.
            let timeout = opts.getattr(intern!(py, "timeout"))?;
            let days: i64 = timeout.getattr(intern!(py, "days"))?.extract()?;
            (days < 0).then_some(Ready::Barrier(core))
        }
    };
    Ok(call.map(|c| (c, asynchronous)))
}

/// The call of method `m` with `args` (the group first), on the fast path or through its
/// Python method.
pub(super) fn call_method(m: Method, args: &Args<'_, '_>) -> PyResult<Py<PyAny>> {
    let py = args.py;
    let ready = match (STATE.get(py), args.iter().next(), args.positional() > 0) {
        (Some(st), Some(group), true) => {
            let rest = Args {
                py,
                ptrs: &args.ptrs[1..],
                kwnames: args.kwnames.clone(),
            };
            match bind(m.params(), &rest) {
                Some(a) => ready_method(m, st, &group.to_owned(), &a),
                None => Ok(None),
            }
        }
        _ => Ok(None),
    };
    let Ok(Some((ready, asynchronous))) = ready else {
        return fallback(&PYTHON_METHODS[m as usize], m.name(), args);
    };
    run_logged(py, m.op(), ready, asynchronous.then_some(Door::Torch))
}
